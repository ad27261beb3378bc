"""Gradient norm and clipping across the dense and sparse meshes, which `torch.nn.utils.clip_grad_norm_`
cannot combine: per (mesh, placements) group the squared local shards are summed and reduced once."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate


def _grads(parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad for p in parameters if p.grad is not None]


def total_grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all gradients as one global vector; fp32 scalar, equal on every rank."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for grad in _grads(parameters):
        if isinstance(grad, DTensor):
            groups.setdefault((grad.device_mesh, grad.placements), []).append(grad)
        else:
            plain.append(grad)
    total = torch.zeros((), dtype=torch.float32)
    for (mesh, placements), grads in groups.items():
        local = torch.stack([g.to_local().float().pow(2).sum() for g in grads]).sum()
        # every non-replicated dim splits it (also FSDP2's _StridedShard, for which is_shard() is False)
        reduce_as = [Replicate() if p.is_replicate() else Partial() for p in placements]
        total = total.to(local.device) + DTensor.from_local(local, mesh, reduce_as, run_check=False).full_tensor()
    for grad in plain:
        total = total.to(grad.device) + grad.float().pow(2).sum()
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale all gradients by min(1, max_norm / (norm + eps)); returns the norm before clipping."""
    parameters = list(parameters)
    norm = total_grad_norm(parameters)
    scale = (max_norm / (norm + eps)).clamp(max=1.0)
    for grad in _grads(parameters):
        (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(scale.to(grad.device))
    return norm
