"""Parameter counts derived from the module tree (big configs are built on the meta device: no memory used)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.model.experts import GroupedExperts
from lumina.model.lumina_model import LuminaModel


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts of a model."""

    dense: int  # every parameter but the routed experts
    experts: int  # the routed experts of every MoE layer
    # (dense, experts) of each FSDP unit: the conditional modules (embedding tables, the image projection,
    # heads) and the decoder layers (`layers.{i}`, with their experts)
    units: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.dense + self.experts


def parameter_counts(model_or_config: LuminaModel | LuminaConfig) -> ParameterCounts:
    """The parameters of the model (a config's model is built on the meta device)."""
    model = model_or_config
    if isinstance(model, LuminaConfig):
        with torch.device("meta"):
            model = LuminaModel(model)
    routed = {id(p) for m in model.modules() if isinstance(m, GroupedExperts) for p in m.parameters()}

    def split(module: nn.Module) -> tuple[int, int]:
        params = list(module.parameters())
        experts = sum(p.numel() for p in params if id(p) in routed)
        return sum(p.numel() for p in params) - experts, experts

    units = {name: split(module) for name, module in model.conditional_modules().items()}
    units |= {f"layers.{i}": split(layer) for i, layer in enumerate(model.model.layers)}
    dense, experts = split(model)
    return ParameterCounts(dense, experts, units)
