"""`flash_varlen`: flash-attn's varlen kernel over the packed segments (CUDA, fp16/bf16, flash-attn installed).

Serves only packs whose rule allows every pair inside every segment (plain bidirectional segments, every
packed token valid): the kernel takes no mask. Tail rows get the fully-masked-row convention.
"""

from __future__ import annotations

import torch

from lumina.attention.backends.common import fill_masked_rows
from lumina.attention.backends.segmented import run_plain
from lumina.attention.spec import AttentionSpec

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None


def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
    if flash_attn_varlen_func is None:
        return "flash-attn is not installed"
    if not q.is_cuda:
        return f"flash-attn needs CUDA tensors, got device {q.device}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs fp16/bf16, got {q.dtype}"
    if q.shape[0] != 1:
        return f"one pack per call (B = 1), got B={q.shape[0]}"
    if not all(run_plain(spec)):
        return "some segment is not plain bidirectional (turn/clean/block rules or invalid tokens inside it)"
    return None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [1, nh, S, hd], k/v [1, nkv, S, hd] -> [1, nh, S, hd]."""
    end = spec.bounds[-1]
    cu = spec.cached("flash_varlen_cu", lambda: torch.tensor(spec.bounds, dtype=torch.int32, device=q.device))
    longest = max(spec.lengths)

    def tokens_first(x: torch.Tensor) -> torch.Tensor:  # [1, h, S, hd] -> [end, h, hd]
        return x[0, :, :end].transpose(0, 1).contiguous()

    out = flash_attn_varlen_func(tokens_first(q), tokens_first(k), tokens_first(v), cu, cu, longest, longest,
                                 dropout_p=0.0, causal=False)  # [end, nh, hd]
    out = out.transpose(0, 1).unsqueeze(0)
    if end < spec.seq_len:
        out = torch.cat([out, out.new_zeros(1, q.shape[1], spec.seq_len - end, q.shape[3])], dim=2)
    return fill_masked_rows(out, q, k, v, spec)
