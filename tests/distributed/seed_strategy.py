"""The seed's behaviour, for the participation tests: a conditional module that ran on zero rows contributes
nothing to autograd (what a rank-conditional head amounts to), so ranks disagree on the modules in backward.

`SeedStrategy` is `FSDP2ExpertParallelStrategy` with that behaviour; `lumina-train
strategy._target_=seed_strategy.SeedStrategy` selects it when this directory is on PYTHONPATH."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lumina.distributed import FSDP2ExpertParallelStrategy, tracked_modules
from lumina.model.linear_ce import HeadLoss


def detach_empty_outputs(modules: dict[str, nn.Module]) -> list[RemovableHandle]:
    """A module that ran on zero rows returns a detached output: its parameters get no gradient there."""
    def hook(module: nn.Module, args: object, output: object) -> object:
        if isinstance(output, torch.Tensor) and output.numel() == 0:
            return output.detach()
        if isinstance(output, HeadLoss) and output.per_row.numel() == 0:  # a head's fused loss on no rows
            return HeadLoss(*(t.detach() for t in output))
        return None
    return [module.register_forward_hook(hook) for module in modules.values()]


class SeedStrategy(FSDP2ExpertParallelStrategy):
    def parallelize_model(self, model: nn.Module, init_from: str | None = None, adapter=()):  # noqa: ANN001, ANN201
        detach_empty_outputs(tracked_modules(model.conditional_modules()))  # before FSDP's hooks
        return super().parallelize_model(model, init_from, adapter)
