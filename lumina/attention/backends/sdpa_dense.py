"""`sdpa_dense`: one SDPA call with the official additive [1, 1, Lq, Lk] mask; the parity reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.attention.backend import Backend, Pairs, register_backend
from lumina.attention.backends.common import additive, fill_masked_rows
from lumina.attention.spec import AttentionSpec


def dense_mask(spec: AttentionSpec, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, Lq, Lk] additive mask in `dtype`, cached on the spec."""
    return spec.cached(("sdpa_dense", dtype), lambda: additive(
        spec.allowed(slice(0, spec.seq_len), slice(0, spec.key_len)), dtype).unsqueeze(1))


@register_backend
class SdpaDense(Backend):
    """Every device; computes all Lq * Lk pairs (masked ones included). Never chosen by `auto`."""

    name = "sdpa_dense"
    pairs = Pairs.DENSE

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
        """q [B, nh, Lq, hd], k/v [B, nkv, Lk, hd] -> [B, nh, Lq, hd]. Fully masked rows go through
        `fill_masked_rows` (same values): torch's CPU SDPA backward is wrong for them."""
        mask = dense_mask(spec, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
        return fill_masked_rows(out, q, k, v, spec)
