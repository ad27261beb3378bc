"""`attend`: dispatch one attention call to the spec's backend (or, non-strict, to its fallback)."""

from __future__ import annotations

import torch

from lumina.attention.backend import AttendCall, backend_class, report
from lumina.attention.spec import AttentionSpec

FALLBACK = "segmented"  # serves every batch on every device


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attend wants 4-D q/k/v [B, heads, L, hd], got q {list(q.shape)}, k {list(k.shape)}, "
                         f"v {list(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} do not match q {list(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {k.shape[1]}")
    if q.shape[2] != spec.seq_len or k.shape[2] != spec.key_len:
        raise ValueError(f"q has {q.shape[2]} rows and k {k.shape[2]}; the spec was built for Lq={spec.seq_len} "
                         f"query rows and Lk={spec.key_len} key rows")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """q [B, nh, Lq, hd] (the spec's query rows), k/v [B, nkv, Lk, hd] (its key rows; kv head j serves query
    heads j*g .. j*g+g-1), non-causal, scale 1/sqrt(hd) -> [B, nh, Lq, hd]. A backend that cannot serve the
    call raises RuntimeError in strict mode, else falls back to `segmented` (logged once)."""
    _check_shapes(q, k, v, spec)
    backend = backend_class(spec.backend)
    reason = backend.unavailable(q, k, v, spec)
    if reason is None and q.device.type not in backend.devices:
        reason = f"runs on {'/'.join(backend.devices)} tensors, got device {q.device}"
    served = spec.backend
    if reason is not None:
        if spec.strict:
            raise RuntimeError(f"attention backend {spec.backend!r} cannot serve this call (strict mode): {reason}")
        served, backend = FALLBACK, backend_class(FALLBACK)
    out = backend.forward(q, k, v, spec)
    report(AttendCall(spec.backend, served, reason))
    return out
