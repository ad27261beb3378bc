"""`segmented`: SDPA per packed segment, segments of equal length batched into one call.

FLOPs and mask memory go from S^2 to sum(L_i^2). Segments whose rule slice allows every pair (plain
bidirectional) run without a mask. The plan (groups, gather indices, masks) is built on the first call and
cached on the spec; masks per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.spec import AttentionSpec


@dataclass
class Group:
    """m segments of one length L: positions `index` [m * L] (None when one contiguous run from `start`),
    `allowed` [1, m, 1, L, L] bool or None when every pair is allowed."""

    length: int
    count: int
    start: int
    index: torch.Tensor | None
    allowed: torch.Tensor | None


@dataclass
class Plan:
    groups: list[Group]
    order: torch.Tensor | None  # [S] gather from the concatenated group outputs back to positions; None = identity
    tail: int  # positions after the packed part


def _contiguous(starts: list[int], length: int) -> bool:
    return all(b - a == length for a, b in zip(starts, starts[1:], strict=False))


def build_plan(spec: AttentionSpec) -> Plan:
    device = spec.valid.device
    by_length: dict[int, list[int]] = {}
    for start, length in zip(spec.bounds, spec.lengths, strict=False):
        by_length.setdefault(length, []).append(start)
    groups, allowed = [], []
    for length, starts in by_length.items():
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)
        index = None if _contiguous(starts, length) else positions.reshape(-1)
        seg_allowed = torch.stack([spec.allowed(slice(s, s + length), slice(s, s + length))[0] for s in starts])
        groups.append(Group(length, len(starts), starts[0], index, seg_allowed[None, :, None]))
        allowed.append(seg_allowed.all())
    plain = torch.stack(allowed).tolist()  # one host read for the whole plan
    for group, is_plain in zip(groups, plain, strict=True):
        if is_plain:
            group.allowed = None
    covered = [torch.arange(g.start, g.start + g.length * g.count, device=device) if g.index is None else g.index
               for g in groups]
    tail = spec.seq_len - spec.bounds[-1]
    covered.append(torch.arange(spec.bounds[-1], spec.seq_len, device=device))
    flat = torch.cat(covered)
    identity = len(groups) == 1 or bool(all(a.start < b.start for a, b in zip(groups, groups[1:], strict=False))
                                        and all(g.index is None for g in groups))
    order = None if identity else torch.argsort(flat)
    return Plan(groups, order, tail)


def _group_masks(plan: Plan, spec: AttentionSpec, dtype: torch.dtype) -> list[torch.Tensor | None]:
    return [None if g.allowed is None else additive(g.allowed, dtype) for g in plan.groups]


def unavailable(q: torch.Tensor, spec: AttentionSpec) -> str | None:
    return None


def _split(x: torch.Tensor, g: Group) -> torch.Tensor:
    """[B, h, S, hd] -> [B, m, h, L, hd] for the group's segments."""
    b, h, _, d = x.shape
    part = x.narrow(2, g.start, g.count * g.length) if g.index is None else x.index_select(2, g.index)
    return part.view(b, h, g.count, g.length, d).transpose(1, 2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd]."""
    plan = spec.cached("segmented", lambda: build_plan(spec))
    masks = spec.cached(("segmented", q.dtype), lambda: _group_masks(plan, spec, q.dtype))
    gqa = k.shape[1] != q.shape[1]
    b, h, _, d = q.shape
    pieces = []
    for group, mask in zip(plan.groups, masks, strict=True):
        out = F.scaled_dot_product_attention(_split(q, group), _split(k, group), _split(v, group),
                                             attn_mask=mask, enable_gqa=gqa)  # [B, m, nh, L, hd]
        pieces.append(out.transpose(1, 2).reshape(b, h, group.count * group.length, d))
    if plan.tail:
        pieces.append(q.new_zeros(b, h, plan.tail, d))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    if plan.order is not None:
        out = out.index_select(2, plan.order)
    return fill_masked_rows(out, q, k, v, spec)
