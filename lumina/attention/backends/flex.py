"""`flex`: torch flex_attention with a BlockMask built from the spec. Mask memory is O(S) per-token vectors
plus the [S/128, S/128] block table (built segment by segment, never Lq * Lk); fully masked blocks are
skipped. flex_attention is compiled once per process (`dynamic=False`). In torch 2.13 flex has no backward on
CPU, so on CPU it serves only calls without gradients.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from lumina.attention.backend import Backend, Pairs, register_backend
from lumina.attention.backends.common import fill_masked_rows
from lumina.attention.rules import Rows
from lumina.attention.spec import AttentionSpec, Side

BLOCK = 128


@functools.cache
def compiled_flex():
    """The process-wide compiled flex_attention (created on first use)."""
    return torch.compile(flex_attention, dynamic=False)


def _padded(t: torch.Tensor, size: int, fill: int | bool) -> torch.Tensor:
    """[1, S] -> [S_pad] so mask_mod never indexes past the end on block-padded positions."""
    return torch.nn.functional.pad(t[0], (0, size - t.shape[1]), value=fill)


def block_table(spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """[nbq, nbk] bools: some pair allowed (any) / every pair allowed (all), from per-segment windows."""
    q_len, k_len, device = spec.seq_len, spec.key_len, spec.queries.valid.device
    any_allowed = torch.zeros(math.ceil(q_len / BLOCK), math.ceil(k_len / BLOCK), dtype=torch.bool, device=device)
    all_allowed = torch.zeros_like(any_allowed)
    q_bounds, k_bounds = spec.queries.bounds, spec.keys.bounds
    for qs, qe, ks, ke in zip(q_bounds, q_bounds[1:], k_bounds, k_bounds[1:], strict=False):
        q_first, q_last = qs // BLOCK, math.ceil(qe / BLOCK)
        k_first, k_last = ks // BLOCK, math.ceil(ke / BLOCK)
        allowed = spec.allowed(slice(q_first * BLOCK, min(q_last * BLOCK, q_len)),
                               slice(k_first * BLOCK, min(k_last * BLOCK, k_len)))[0]
        allowed = torch.nn.functional.pad(allowed, (0, (k_last - k_first) * BLOCK - allowed.shape[1],
                                                    0, (q_last - q_first) * BLOCK - allowed.shape[0]), value=False)
        tiles = allowed.view(q_last - q_first, BLOCK, k_last - k_first, BLOCK)
        any_allowed[q_first:q_last, k_first:k_last] = tiles.any(dim=3).any(dim=1)
        all_allowed[q_first:q_last, k_first:k_last] = tiles.all(dim=3).all(dim=1)
    return any_allowed, all_allowed


def _padded_side(side: Side) -> tuple[torch.Tensor, torch.Tensor, Rows]:
    """One side's seg_id, valid and rows as [L_pad] vectors (L rounded up to BLOCK)."""
    size = math.ceil(side.length / BLOCK) * BLOCK
    clean, turn, block, kind = side.rows
    rows = Rows(_padded(clean, size, False), *(_padded(t, size, 0) for t in (turn, block, kind)))
    return _padded(side.seg_id, size, -1), _padded(side.valid, size, False), rows


def build_block_mask(spec: AttentionSpec) -> BlockMask:
    q_seg, q_valid, q_rows = _padded_side(spec.queries)
    k_seg, k_valid, k_rows = _padded_side(spec.keys)
    rule = spec.rule

    def mask_mod(b, h, q_idx, kv_idx):
        allow = rule.allow(Rows(*(t[q_idx] for t in q_rows)), Rows(*(t[kv_idx] for t in k_rows)))
        return (q_seg[q_idx] == k_seg[kv_idx]) & q_valid[q_idx] & k_valid[kv_idx] & allow

    any_allowed, all_allowed = block_table(spec)
    partial = any_allowed & ~all_allowed

    def counts_and_indices(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(table.to(torch.int8), dim=-1, descending=True, stable=True)
        return table.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    kv_num, kv_idx = counts_and_indices(partial)
    full_num, full_idx = counts_and_indices(all_allowed)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(spec.seq_len, spec.key_len))


@register_backend
class Flex(Backend):
    """CPU (without gradients) and CUDA; computes only the allowed pairs' blocks."""

    name = "flex"
    pairs = Pairs.ALLOWED
    plans_runs = True
    auto_rank = 1

    @classmethod
    def auto_here(cls) -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
        if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            return (f"flex_attention has no backward on CPU in torch {torch.__version__}; "
                    "train with 'segmented' on CPU or use flex on CUDA")
        return None

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
        block_mask = spec.cached("flex", lambda: build_block_mask(spec))
        out = compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
        return fill_masked_rows(out, q, k, v, spec)
