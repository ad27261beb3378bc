"""`freeze_parameters`: switch off gradients for parameters whose names match shell-style globs."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from torch import nn

from lumina.training.errors import ConfigError


def freeze_parameters(model: nn.Module, globs: Sequence[str]) -> list[str]:
    """Set requires_grad=False on every parameter matching one of `globs` (fnmatch, e.g. "*.mlp.gate.weight");
    returns the frozen names. A glob matching nothing is a ConfigError."""
    names = [name for name, _ in model.named_parameters()]
    frozen: set[str] = set()
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"model.freeze entry {pattern!r}: expected a non-empty glob string")
        hits = [n for n in names if fnmatchcase(n, pattern)]
        if not hits:
            raise ConfigError(f"model.freeze={pattern!r}: matches no parameter "
                              f"(names look like {names[0]!r}, ...)" if names else
                              f"model.freeze={pattern!r}: the model has no parameters")
        frozen.update(hits)
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    return [n for n in names if n in frozen]
