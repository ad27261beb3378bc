"""`attend`: dispatch one attention call to the spec's backend (or, non-strict, to its fallback)."""

from __future__ import annotations

import torch

from lumina.attention.backends import flash_varlen, flex, sdpa_dense, segmented
from lumina.attention.counters import count
from lumina.attention.spec import AttentionSpec

FALLBACK = "segmented"  # serves every batch on every device
_BACKENDS = {"sdpa_dense": sdpa_dense, "segmented": segmented, "flex": flex, "flash_varlen": flash_varlen}


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attend wants 4-D q/k/v [B, heads, S, hd], got q {list(q.shape)}, k {list(k.shape)}, "
                         f"v {list(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} do not match q {list(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {k.shape[1]}")
    if q.shape[2] != spec.seq_len:
        raise ValueError(f"q has sequence length {q.shape[2]}, the spec was built for S={spec.seq_len}")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Packed block-diffusion attention. q [B, nh, S, hd], k/v [B, nkv, S, hd] (kv head j serves query heads
    j*g .. j*g+g-1), non-causal, scale 1/sqrt(hd) -> [B, nh, S, hd].

    Rows with token_valid false get the mean of V over all keys (the official finfo.min convention). A
    backend that cannot serve this call raises RuntimeError in strict mode, else falls back to `segmented`
    (counted as "fallback:<backend>->segmented")."""
    _check_shapes(q, k, v, spec)
    name = spec.backend
    backend = _BACKENDS[name]
    reason = backend.unavailable(q, k, v, spec)
    if reason is not None:
        if spec.strict:
            raise RuntimeError(f"attention backend {name!r} cannot serve this call (strict mode): {reason}")
        count(f"fallback:{name}->{FALLBACK}")
        name, backend = FALLBACK, _BACKENDS[FALLBACK]
    count(name)
    return backend.forward(q, k, v, spec)
