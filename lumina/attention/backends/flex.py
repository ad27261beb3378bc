"""`flex`: torch flex_attention with a BlockMask built from the spec.

Mask memory is O(S) per-token vectors plus the [S/128, S/128] block table; fully masked blocks are skipped.
The table is built segment by segment (peak temporary sum of block-aligned L_i^2 bools, never S^2), and the
`mask_mod` reads the per-token vectors through the same `rules_allow` as every other backend. flex_attention
is compiled once per process (`dynamic=False`: one compile per shape family, not per step). In torch 2.13
flex has no backward on CPU, so on CPU it serves only calls without gradients.
"""

from __future__ import annotations

import math

import torch

from lumina.attention.backends.common import fill_masked_rows
from lumina.attention.rules import rules_allow
from lumina.attention.spec import AttentionSpec

BLOCK = 128

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - torch without flex attention
    BlockMask = flex_attention = None

_compiled = None


def compiled_flex():
    """The process-wide compiled flex_attention (created on first use)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
    if flex_attention is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return (f"flex_attention has no backward on CPU in torch {torch.__version__}; "
                "train with 'segmented' on CPU or use flex on CUDA")
    return None


def _padded(t: torch.Tensor, size: int, fill: int | bool) -> torch.Tensor:
    """[1, S] -> [S_pad] so mask_mod never indexes past the end on block-padded positions."""
    return torch.nn.functional.pad(t[0], (0, size - t.shape[1]), value=fill)


def block_table(spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """[nb, nb] bools: some pair allowed (any) / every pair allowed (all), from per-segment windows."""
    seq_len, device = spec.seq_len, spec.valid.device
    blocks = math.ceil(seq_len / BLOCK)
    any_allowed = torch.zeros(blocks, blocks, dtype=torch.bool, device=device)
    all_allowed = torch.zeros(blocks, blocks, dtype=torch.bool, device=device)
    for start, end in zip(spec.bounds, spec.bounds[1:], strict=False):
        first, last = start // BLOCK, math.ceil(end / BLOCK)
        window = slice(first * BLOCK, min(last * BLOCK, seq_len))
        allowed = spec.allowed(window, window)[0]
        pad = (last - first) * BLOCK - allowed.shape[0]
        allowed = torch.nn.functional.pad(allowed, (0, pad, 0, pad), value=False)
        tiles = allowed.view(last - first, BLOCK, last - first, BLOCK)
        any_allowed[first:last, first:last] = tiles.any(dim=3).any(dim=1)
        all_allowed[first:last, first:last] = tiles.all(dim=3).all(dim=1)
    return any_allowed, all_allowed


def build_block_mask(spec: AttentionSpec) -> BlockMask:
    seq_len = spec.seq_len
    size = math.ceil(seq_len / BLOCK) * BLOCK
    seg = _padded(spec.seg_id, size, -1)
    valid = _padded(spec.valid, size, False)
    clean = _padded(spec.is_clean, size, False)
    turn, block, kind = (_padded(t, size, 0) for t in (spec.turn_ids, spec.block_ids, spec.type_ids))
    full = spec.full_rules

    def mask_mod(b, h, q_idx, kv_idx):
        rules = rules_allow(full, clean[q_idx], clean[kv_idx], turn[q_idx], turn[kv_idx],
                            block[q_idx], block[kv_idx], kind[q_idx], kind[kv_idx])
        return (seg[q_idx] == seg[kv_idx]) & valid[q_idx] & valid[kv_idx] & rules

    any_allowed, all_allowed = block_table(spec)
    partial = any_allowed & ~all_allowed

    def counts_and_indices(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(table.to(torch.int8), dim=-1, descending=True, stable=True)
        return table.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    kv_num, kv_idx = counts_and_indices(partial)
    full_num, full_idx = counts_and_indices(all_allowed)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(seq_len, seq_len))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd]."""
    block_mask = spec.cached("flex", lambda: build_block_mask(spec))
    out = compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
    return fill_masked_rows(out, q, k, v, spec)
