"""`segmented`: SDPA per packed segment; adjacent segments of equal length share one call.

FLOPs and mask memory go from S^2 to sum(L_i^2). The pack is split (views) into runs: a run is one segment,
or several adjacent segments of equal length, which become the batch dim of one SDPA call. Working in the
token-major layout [B, S, h, hd] (what q.transpose(1, 2) of a fused-QKV projection already is) makes every
split a view; the outputs are joined with one cat, and the backward is one cat per input. Runs whose rule
slice allows every pair (plain bidirectional) run without a mask. The plan is built on the first call and
cached on the spec; masks per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.spec import AttentionSpec


@dataclass
class Run:
    """`count` adjacent segments of `length` tokens from `start`; `plain` when the rule allows every pair
    inside each of them (no mask needed)."""

    start: int
    length: int
    count: int
    plain: bool = False

    @property
    def size(self) -> int:
        return self.length * self.count


@dataclass
class Plan:
    runs: list[Run]
    tail: int  # positions after the packed part (token_valid false)


def build_plan(spec: AttentionSpec) -> Plan:
    """Runs of adjacent equal-length segments and whether each is plain (one host read)."""
    runs: list[Run] = []
    for start, length in zip(spec.bounds, spec.lengths, strict=False):
        if runs and runs[-1].length == length:
            runs[-1].count += 1
        else:
            runs.append(Run(start, length, 1))
    plain = torch.stack([run_allowed(spec, run).all() for run in runs]).tolist()
    for run, is_plain in zip(runs, plain, strict=True):
        run.plain = is_plain
    return Plan(runs, spec.seq_len - spec.bounds[-1])


def run_allowed(spec: AttentionSpec, run: Run) -> torch.Tensor:
    """[m, 1, L, L] bool rule slices of the run's segments."""
    starts = range(run.start, run.start + run.size, run.length)
    return torch.stack([spec.allowed(slice(s, s + run.length), slice(s, s + run.length)) for s in starts])


def plan_of(spec: AttentionSpec) -> Plan:
    return spec.cached("segmented", lambda: build_plan(spec))


def run_masks(spec: AttentionSpec, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """Additive [m, 1, L, L] masks in `dtype` per run (None for plain runs), cached: sum(L_i^2) elements."""
    plan = plan_of(spec)
    return spec.cached(("segmented", dtype), lambda: [
        None if run.plain else additive(run_allowed(spec, run), dtype) for run in plan.runs])


def unavailable(q: torch.Tensor, spec: AttentionSpec) -> str | None:
    return None


def _run_batch(x: torch.Tensor, run: Run) -> torch.Tensor:
    """Token-major run [B, m * L, h, hd] -> [B * m, h, L, hd] (a view when B = 1)."""
    b, _, h, d = x.shape
    return x.reshape(b * run.count, run.length, h, d).transpose(1, 2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd] (token-major memory layout)."""
    plan = plan_of(spec)
    masks = run_masks(spec, q.dtype)
    gqa = k.shape[1] != q.shape[1]
    b, h, _, d = q.shape
    sizes = [run.size for run in plan.runs] + ([plan.tail] if plan.tail else [])
    q_runs, k_runs, v_runs = (x.transpose(1, 2).split(sizes, dim=1) for x in (q, k, v))
    pieces = []
    for run, mask, qr, kr, vr in zip(plan.runs, masks, q_runs, k_runs, v_runs, strict=False):
        if mask is not None and b > 1 and run.count > 1:
            mask = mask.repeat(b, 1, 1, 1)
        out = F.scaled_dot_product_attention(_run_batch(qr, run), _run_batch(kr, run), _run_batch(vr, run),
                                             attn_mask=mask, enable_gqa=gqa)  # [B * m, nh, L, hd]
        pieces.append(out.transpose(1, 2).reshape(b, run.size, h, d))
    if plan.tail:
        pieces.append(q.new_zeros(b, plan.tail, h, d))
    out = (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)).transpose(1, 2)
    return fill_masked_rows(out, q, k, v, spec)
