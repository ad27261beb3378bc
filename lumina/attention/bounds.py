"""Segment bounds of a pack: `cu_seqlens` read to the host once and validated."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lumina.contract.batch import as_int_tuple


def check_bounds(bounds: Sequence[int], seq_len: int, name: str = "cu_seqlens") -> tuple[int, ...]:
    """Validate host bounds: integers that start at 0, strictly increase, end at or before `seq_len`."""
    bounds = as_int_tuple(name, bounds)
    if len(bounds) < 2:
        raise ValueError(f"{name} must hold at least 2 entries (one segment), got {list(bounds)}")
    if bounds[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0]={bounds[0]} in {list(bounds)}")
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if b <= a:
            raise ValueError(f"{name} must strictly increase, got {name}[{i}]={a} >= {name}[{i + 1}]={b} "
                             f"in {list(bounds)}")
    if bounds[-1] > seq_len:
        raise ValueError(f"{name} must end at or before S={seq_len}, got {name}[-1]={bounds[-1]}")
    return bounds


def resolve_seg_bounds(cu_seqlens: torch.Tensor | Sequence[int] | None, seq_len: int) -> tuple[int, ...] | None:
    """cu_seqlens [n + 1] -> validated host tuple (one device read); None when it is None or holds fewer than
    2 entries. Raises ValueError naming the offending values otherwise."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D [n + 1], got shape {list(cu_seqlens.shape)}")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens has dtype {cu_seqlens.dtype}; expected an integer tensor")
        values = cu_seqlens.tolist()
    else:
        values = list(cu_seqlens)
    if len(values) < 2:
        return None
    return check_bounds(values, seq_len)
