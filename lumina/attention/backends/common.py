"""Helpers shared by the backends."""

from __future__ import annotations

import torch

from lumina.attention.spec import AttentionSpec


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool allowed -> additive mask in `dtype`: 0 where allowed, finfo(dtype).min where blocked (official)."""
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=allowed.device), blocked)


def _delta(x: torch.Tensor) -> torch.Tensor:
    """Zero in value, identity in gradient."""
    return x - x.detach()


def uniform_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What SDPA gives a fully masked row under the official finfo.min mask, in O(S hd^2) instead of O(S^2 hd).
    The forward is the mean of V over all S keys; autograd differentiates the softmax at that uniform point
    (d out_i / d s_ij = (v_j - mean v) / S), linear in q and k with s_ij = scale q_i.k_j, so
        out_i = mean v + scale/S * (dq_i^T K^T (V - mean v) + q_i^T dK^T (V - mean v)),
    dq, dK zero in value and identity in gradient. q [B, nh, N, hd] (the masked rows), k/v [B, nkv, S, hd].
    """
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 / k.shape[2]
    mean = v.mean(dim=2, keepdim=True)
    centered = v - mean
    through_q = (k.transpose(-1, -2) @ centered).repeat_interleave(groups, dim=1)  # [B, nh, hd, hd]
    through_k = (_delta(k).transpose(-1, -2) @ centered.detach()).repeat_interleave(groups, dim=1)
    correction = (_delta(q) @ through_q + q.detach() @ through_k) * scale
    return mean.repeat_interleave(groups, dim=1) + correction


def invalid_rows(spec: AttentionSpec) -> torch.Tensor:
    """[N] int64 query positions with token_valid false, cached (N is known on the host: no sync)."""
    return spec.cached("invalid_rows",
                       lambda: torch.nonzero_static(~spec.queries.valid[0], size=spec.num_invalid)[:, 0])


def fill_masked_rows(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     spec: AttentionSpec) -> torch.Tensor:
    """Replace the rows with token_valid false (exactly the fully masked rows: every valid token may attend
    itself under both rule sets) by `uniform_attention`, so every backend equals `sdpa_dense` at every row,
    forward and backward, and stays finite. out/q [B, nh, Lq, hd], k/v [B, nkv, Lk, hd] (all keys)."""
    if spec.num_invalid == 0:
        return out
    rows = invalid_rows(spec)
    filled = uniform_attention(q.index_select(2, rows), k, v).to(out.dtype)
    # in the token-major layout [B, S, h, hd], which the segmented backend and SDPA's CPU kernel produce
    return out.transpose(1, 2).index_copy(1, rows, filled.transpose(1, 2)).transpose(1, 2)
