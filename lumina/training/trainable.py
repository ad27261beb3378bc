"""`mark_trainable`: the one rule of which parameters of a model train, applied by `LuminaModule` and by the
memory estimate alike (`trainable = mark_trainable(model, freeze=["*.mlp.experts.*"])`)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lumina.training.freeze import freeze_parameters


def mark_trainable(model: nn.Module, freeze: Sequence[str] = ()) -> dict[str, nn.Parameter]:
    """Switch off gradients for parameters matching a `freeze` glob; return the trainable ones by name."""
    freeze_parameters(model, freeze)
    return {name: param for name, param in model.named_parameters() if param.requires_grad}
