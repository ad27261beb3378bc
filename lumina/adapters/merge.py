"""Merging a LoRA adapter into its base: W + scale * B A, the sum formed in fp32 and cast to W's dtype.
`merged_state_dict` gives the base state dict with the adapted weights merged (what an export writes);
`merge_adapter` a plain model holding them."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from lumina.adapters.lora import factor_keys, lora_modules, lora_parameter_names, replace_module


def merged_weights(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None,
                   device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """State-dict key of each adapted base weight -> W + scale * B A, its values read from `state` (whole
    tensors; None: the model's own state dict), on `device` (None: the weight's)."""
    state = model.state_dict() if state is None else state
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in lora_modules(model).items():
            for key, (a, b) in factor_keys(name, module).items():
                weight = state[key]
                delta = module.scale * (state[b].float() @ state[a].float())  # [out, in] or [E, out, in]
                out[key] = (weight.float() + delta).to(dtype=weight.dtype, device=device or weight.device)
    return out


def merged_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None,
                      device: torch.device | str | None = "cpu") -> dict[str, torch.Tensor]:
    """`model`'s base state dict (its keys and order, no LoRA factor) with every adapted weight merged; values
    from `state` (None: the model's own state dict; a sharded model's gathered one, `full_state_dict`), the
    merged tensors on `device` (CPU by default: a merged copy of the experts need not fit beside the model)."""
    state = model.state_dict() if state is None else state
    merged, factors = merged_weights(model, state, device), set(lora_parameter_names(model))
    return {key: merged.get(key, value) for key, value in state.items() if key not in factors}


def merge_adapter(model: nn.Module) -> nn.Module:
    """A copy of `model` with each LoRA-adapted module replaced by its base module holding the merged weights;
    `model` itself is left as it is. The copy's parameters keep the base's requires_grad flags."""
    merged = merged_weights(model)
    plain = copy.deepcopy(model)
    for name, module in lora_modules(plain).items():
        replace_module(plain, name, module.base)
    with torch.no_grad():
        for key, value in merged.items():
            plain.get_parameter(key).copy_(value)
    return plain
