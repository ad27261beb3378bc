"""`flash_varlen`: flash-attn's varlen kernel over the packed segments (CUDA, fp16/bf16, flash-attn installed).

Serves only packs whose rule allows every pair inside every segment (the kernel takes no mask); query segments
may be shorter than key segments. Tail rows get the fully-masked-row convention.
"""

from __future__ import annotations

import torch

from lumina.attention.backend import Backend, Pairs, register_backend
from lumina.attention.backends.common import fill_masked_rows
from lumina.attention.spec import AttentionSpec

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None


@register_backend
class FlashVarlen(Backend):
    """CUDA only, needs flash-attn; computes every pair inside each segment. `auto` prefers it on CUDA."""

    name = "flash_varlen"
    devices = ("cuda",)
    pairs = Pairs.SEGMENTS
    plans_runs = True
    auto_rank = 2

    @classmethod
    def auto_here(cls) -> bool:
        return torch.cuda.is_available() and flash_attn_varlen_func is not None

    @staticmethod
    def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
        if flash_attn_varlen_func is None:
            return "flash-attn is not installed"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn needs fp16/bf16, got {q.dtype}"
        if q.shape[0] != 1:
            return f"one pack per call (B = 1), got B={q.shape[0]}"
        if not all(spec.plain()):
            return "some segment is not plain bidirectional (turn/clean/block rules or invalid tokens inside it)"
        return None

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
        """q [1, nh, Lq, hd], k/v [1, nkv, Lk, hd] -> [1, nh, Lq, hd]."""
        q_bounds, k_bounds = spec.queries.bounds, spec.keys.bounds
        cu_q, cu_k = spec.cached("flash_varlen_cu", lambda: tuple(
            torch.tensor(b, dtype=torch.int32, device=q.device) for b in (q_bounds, k_bounds)))

        def longest(bounds: tuple[int, ...]) -> int:
            return max(b - a for a, b in zip(bounds, bounds[1:], strict=False))

        def tokens_first(x: torch.Tensor, end: int) -> torch.Tensor:  # [1, h, L, hd] -> [end, h, hd]
            return x[0, :, :end].transpose(0, 1).contiguous()

        q_end, k_end = q_bounds[-1], k_bounds[-1]
        out = flash_attn_varlen_func(tokens_first(q, q_end), tokens_first(k, k_end), tokens_first(v, k_end),
                                     cu_q, cu_k, longest(q_bounds), longest(k_bounds),
                                     dropout_p=0.0, causal=False)  # [q_end, nh, hd]
        out = out.transpose(0, 1).unsqueeze(0)
        if q_end < spec.seq_len:
            out = torch.cat([out, out.new_zeros(1, q.shape[1], spec.seq_len - q_end, q.shape[3])], dim=2)
        return fill_masked_rows(out, q, k, v, spec)
