"""Packed block-diffusion attention: the spec built once per forward, the rule, and the backends.

    backend = resolve_backend(config.attn_backend)  # once, when the model is built ("auto" -> this machine's)
    spec = build_spec(batch, backend=backend, strict=config.attn_strict)  # once per forward
    out = attend(q, k, v, spec)  # per layer: q [B, nh, S, hd], k/v [B, nkv, S, hd] -> [B, nh, S, hd]

Backends: sdpa_dense (official additive [1, 1, S, S] mask; the reference), segmented (SDPA per run of
equal-length segments, sum(L_i^2)), flex (flex_attention + BlockMask, O(S) mask; no CPU backward),
flash_varlen (flash-attn, plain segments on CUDA); `resolve_backend("auto")` picks flash_varlen, else flex
on CUDA, else segmented (once, when the model is built). Rows with token_valid false get the official
fully-masked-row result (mean of V over all keys) in every backend, with exact, finite gradients.
`allowed_mask` is the dense reference of the rule; `backend_calls` counts which path served each call.
"""

from lumina.attention.attend import attend
from lumina.attention.bounds import resolve_seg_bounds
from lumina.attention.counters import backend_calls, reset_backend_calls
from lumina.attention.rules import allowed_mask
from lumina.attention.select import AUTO, resolve_backend
from lumina.attention.spec import BACKENDS, AttentionSpec, build_spec

__all__ = [
    "AUTO",
    "BACKENDS",
    "AttentionSpec",
    "allowed_mask",
    "attend",
    "backend_calls",
    "build_spec",
    "reset_backend_calls",
    "resolve_backend",
    "resolve_seg_bounds",
]
