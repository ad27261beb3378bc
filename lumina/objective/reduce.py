"""Sums over the data-parallel ranks (skipped when torch.distributed is not initialised)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def dp_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Number of ranks whose gradients are averaged (1 without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def dp_sum(local: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """One on-device all_reduce(SUM) of a small tensor; returns a new tensor (the input is not modified)."""
    total = local.detach().clone()
    if dp_world_size(group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total
