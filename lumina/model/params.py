"""Parameter counts derived from the module tree (build the model on the meta device for big configs)."""

from __future__ import annotations

import torch

from lumina.model.config import LuminaConfig
from lumina.model.experts import GroupedExperts
from lumina.model.lumina_model import LuminaModel


def _as_model(model_or_config: LuminaModel | LuminaConfig) -> LuminaModel:
    if isinstance(model_or_config, LuminaModel):
        return model_or_config
    with torch.device("meta"):
        return LuminaModel(model_or_config)


def count_parameters(model_or_config: LuminaModel | LuminaConfig) -> int:
    """All parameters (buffers excluded)."""
    return sum(p.numel() for p in _as_model(model_or_config).parameters())


def active_parameters_per_text_token(model_or_config: LuminaModel | LuminaConfig) -> int:
    """Parameters one text token's forward touches: everything except the embedding lookups and the image-side
    modules (`conditional_modules` other than `lm_head`), with routed experts counted at k of E per layer."""
    model = _as_model(model_or_config)
    skipped = {id(p) for name, module in model.conditional_modules().items() if name != "lm_head"
               for p in module.parameters()}
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in skipped:
                continue
            if isinstance(module, GroupedExperts):
                k = model.config.num_experts_per_tok
                total += p.numel() // module.num_local_experts * k
            else:
                total += p.numel()
    return total
