"""A differentiable variable-split all-to-all (backward = the same exchange with the splits swapped)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
               group: dist.ProcessGroup) -> torch.Tensor:
    """x [sum(in_splits), ...]: rows in_splits[r] go to rank r; returns [sum(out_splits), ...] with the
    out_splits[r] rows received from rank r, in rank order."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
              group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # noqa: ANN001, ANN205
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return _exchange(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None
