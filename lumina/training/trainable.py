"""`mark_trainable`: the one rule of which parameters of a model train.

    trainable = mark_trainable(model, freeze=["*.mlp.experts.*"])   # {name: parameter}, in model order

`LuminaModule.configure_model` applies it to the model it trains (the optimizer then takes exactly the
parameters with `requires_grad`, `lumina.training.optim.split_decay`) and the memory estimate applies it to a
model built on the meta device (`lumina.training.memory_estimate`), so both count the same parameters. Today
the rule is the `model.freeze` globs (`lumina.training.freeze`); a part that adds parameters and freezes the
base (an adapter) plugs in here, for both at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lumina.training.freeze import freeze_parameters


def mark_trainable(model: nn.Module, freeze: Sequence[str] = ()) -> dict[str, nn.Parameter]:
    """Switch off gradients for the parameters `model` does not train (those matching a `freeze` glob) and
    return the ones it trains, by name. Raises ConfigError for a glob matching nothing."""
    freeze_parameters(model, freeze)
    return {name: param for name, param in model.named_parameters() if param.requires_grad}
