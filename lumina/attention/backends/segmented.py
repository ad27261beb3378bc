"""`segmented`: SDPA per packed segment: FLOPs and mask memory go from Lq * Lk to sum(Lq_i * Lk_i). A run of
adjacent segments of equal (query, key) lengths becomes the batch dim of one SDPA call; in the token-major
layout [B, S, h, hd] every split is a view. Plain runs (the rule allows every pair) run without a mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.attention.backend import Backend, Pairs, register_backend
from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.spec import AttentionSpec


def run_masks(spec: AttentionSpec, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """Additive [m, 1, Lq, Lk] masks in `dtype` per run (None for plain runs), cached."""
    return spec.cached(("segmented", dtype), lambda: [
        None if plain else additive(spec.run_allowed(run), dtype)
        for run, plain in zip(spec.runs, spec.plain(), strict=True)])


def _run_batch(x: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """Token-major run [B, count * length, h, hd] -> [B * count, h, length, hd] (a view when B = 1)."""
    b, _, h, d = x.shape
    return x.reshape(b * count, length, h, d).transpose(1, 2)


def _split(x: torch.Tensor, sizes: list[int], length: int) -> tuple[torch.Tensor, ...]:
    """[B, h, L, hd] -> token-major pieces of `sizes` rows, plus the tail up to `length`."""
    tail = length - sum(sizes)
    return x.transpose(1, 2).split(sizes + ([tail] if tail else []), dim=1)


@register_backend
class Segmented(Backend):
    """Every device, every batch: `attend`'s fallback; `auto` picks it where nothing faster serves."""

    name = "segmented"
    pairs = Pairs.SEGMENTS
    plans_runs = True
    auto_rank = 0

    @classmethod
    def auto_here(cls) -> bool:
        return True

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
        """q [B, nh, Lq, hd], k/v [B, nkv, Lk, hd] -> [B, nh, Lq, hd] (token-major memory layout)."""
        masks = run_masks(spec, q.dtype)
        gqa = k.shape[1] != q.shape[1]
        b, h, _, d = q.shape
        q_runs = _split(q, [run.q_size for run in spec.runs], spec.seq_len)
        k_runs, v_runs = (_split(x, [run.k_size for run in spec.runs], spec.key_len) for x in (k, v))
        pieces = []
        for run, mask, qr, kr, vr in zip(spec.runs, masks, q_runs, k_runs, v_runs, strict=False):
            if mask is not None and b > 1 and run.count > 1:
                mask = mask.repeat(b, 1, 1, 1)
            out = F.scaled_dot_product_attention(
                _run_batch(qr, run.count, run.q_length), _run_batch(kr, run.count, run.k_length),
                _run_batch(vr, run.count, run.k_length), attn_mask=mask, enable_gqa=gqa)  # [B * m, nh, Lq, hd]
            pieces.append(out.transpose(1, 2).reshape(b, run.q_size, h, d))
        tail = spec.seq_len - spec.bounds[-1]
        if tail:
            pieces.append(q.new_zeros(b, tail, h, d))
        out = (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)).transpose(1, 2)
        return fill_masked_rows(out, q, k, v, spec)
