"""`merge_adapter`: a plain model (no adapter modules) whose weights are base + scale * B A."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lumina.adapters.lora import EXPERT_PROJS, LoRAGroupedExperts, LoRALinear, lora_modules, replace_module


def merge_adapter(model: nn.Module) -> nn.Module:
    """A copy of `model` with each LoRA-adapted module replaced by its base module holding W + scale * B A,
    the sum formed in fp32 and cast to W's dtype; `model` itself is left as it is. The copy's parameters keep
    the base's requires_grad flags."""
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in lora_modules(merged).items():
            if isinstance(module, LoRALinear):
                module.weight.copy_((module.weight.float() + module.delta_weight()).to(module.weight.dtype))
            elif isinstance(module, LoRAGroupedExperts):
                deltas = module.delta_weights()
                for proj in EXPERT_PROJS:
                    weight = getattr(module, proj)
                    weight.copy_((weight.float() + deltas[proj]).to(weight.dtype))
            replace_module(merged, name, module.base)
    return merged
