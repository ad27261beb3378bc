"""`segmented`: SDPA per packed segment; adjacent segments of equal length share one call.

FLOPs and mask memory go from S^2 to sum(L_i^2). The pack is split (views) into runs: a run is one segment,
or several adjacent segments of equal length, which become the batch dim of one SDPA call. Working in the
token-major layout [B, S, h, hd] (what q.transpose(1, 2) of a fused-QKV projection already is) makes every
split a view; the outputs are joined with one cat, and the backward is one cat per input. Runs whose rule
slice allows every pair (plain bidirectional) run without a mask. Masks are built on the first call and
cached on the spec per dtype; build_spec already decided which runs are plain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.runs import Run
from lumina.attention.spec import AttentionSpec


def run_plain(spec: AttentionSpec) -> tuple[bool, ...]:
    """Per run: no mask needed. build_spec computes this for the plan backends; a spec built for another
    backend pays one host read here, once."""
    if spec.run_plain is None:
        spec.run_plain = tuple(bool(p) for p in spec.plain_flags().tolist())
    return spec.run_plain


def run_masks(spec: AttentionSpec, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """Additive [m, 1, L, L] masks in `dtype` per run (None for plain runs), cached: sum(L_i^2) elements."""
    return spec.cached(("segmented", dtype), lambda: [
        None if plain else additive(spec.run_allowed(run), dtype)
        for run, plain in zip(spec.runs, run_plain(spec), strict=True)])


def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
    return None


def _run_batch(x: torch.Tensor, run: Run) -> torch.Tensor:
    """Token-major run [B, m * L, h, hd] -> [B * m, h, L, hd] (a view when B = 1)."""
    b, _, h, d = x.shape
    return x.reshape(b * run.count, run.length, h, d).transpose(1, 2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd] (token-major memory layout)."""
    masks = run_masks(spec, q.dtype)
    tail = spec.seq_len - spec.bounds[-1]
    gqa = k.shape[1] != q.shape[1]
    b, h, _, d = q.shape
    sizes = [run.size for run in spec.runs] + ([tail] if tail else [])
    q_runs, k_runs, v_runs = (x.transpose(1, 2).split(sizes, dim=1) for x in (q, k, v))
    pieces = []
    for run, mask, qr, kr, vr in zip(spec.runs, masks, q_runs, k_runs, v_runs, strict=False):
        if mask is not None and b > 1 and run.count > 1:
            mask = mask.repeat(b, 1, 1, 1)
        out = F.scaled_dot_product_attention(_run_batch(qr, run), _run_batch(kr, run), _run_batch(vr, run),
                                             attn_mask=mask, enable_gqa=gqa)  # [B * m, nh, L, hd]
        pieces.append(out.transpose(1, 2).reshape(b, run.size, h, d))
    if tail:
        pieces.append(q.new_zeros(b, tail, h, d))
    out = (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)).transpose(1, 2)
    return fill_masked_rows(out, q, k, v, spec)
