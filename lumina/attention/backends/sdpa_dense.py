"""`sdpa_dense`: one SDPA call with the official additive [1, 1, S, S] mask; the parity reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.spec import AttentionSpec


def dense_mask(spec: AttentionSpec, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, S, S] additive mask in `dtype`, cached on the spec."""
    whole = slice(0, spec.seq_len)
    return spec.cached(("sdpa_dense", dtype), lambda: additive(spec.allowed(whole, whole), dtype).unsqueeze(1))


def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> str | None:
    return None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd].

    Fully masked rows average all keys (official). Their SDPA rows are replaced by `fill_masked_rows`, which
    gives the same values: torch's CPU SDPA backward is wrong for fully masked finfo.min rows (it disagrees
    with the math kernel), and the replacement keeps gradients exact."""
    mask = dense_mask(spec, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    return fill_masked_rows(out, q, k, v, spec)
