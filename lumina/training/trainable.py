"""`mark_trainable`: the one rule of which parameters of a model train, applied by `LuminaModule` and by the
memory estimate alike (`trainable = mark_trainable(model, freeze=["*.mlp.experts.*"])`; with an adapter that
freezes the base, `mark_trainable(model, only=adapter.trainable(model, adapter.apply(model)))`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from torch import nn

from lumina.training.freeze import freeze_parameters


def mark_trainable(model: nn.Module, freeze: Sequence[str] = (),
                   only: Collection[str] | None = None) -> dict[str, nn.Parameter]:
    """Switch off gradients for parameters matching a `freeze` glob and, when `only` is given (what an adapter
    trains: its own parameters and the modules it trains whole), for every parameter not in it; return the
    trainable ones by name."""
    freeze_parameters(model, freeze)
    if only is not None:
        names = {name for name, _ in model.named_parameters()}
        unknown = sorted(set(only) - names)
        if unknown:
            raise ValueError(f"mark_trainable: only names {unknown[0]!r}, not a parameter of the model")
        for name, param in model.named_parameters():
            if name not in only:
                param.requires_grad_(False)
    return {name: param for name, param in model.named_parameters() if param.requires_grad}
