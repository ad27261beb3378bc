"""Packed block-diffusion attention: the spec built once per forward, the rule, and the backends.

    backend = resolve_backend(config.attn_backend)  # once, when the model is built ("auto" -> this machine's)
    spec = build_spec(batch, backend=backend, strict=config.attn_strict, rule=config.attn_rule)  # per forward
    out = attend(q, k, v, spec)  # per layer: q [B, nh, Lq, hd], k/v [B, nkv, Lk, hd] -> [B, nh, Lq, hd]

A `KVCache` holds the keys and values of the rows the rule makes final; `KVCache.step` gives one forward's
query rows and key rows (`LuminaModel.backbone(step.queries, step)`).

Backends: `BACKENDS` (`lumina.attention.backends`, sdpa_dense the reference); rules: `RULES`
(`lumina.attention.rules`), `allowed_mask` their dense reference. Rows with token_valid false get the
official fully-masked-row result (mean of V over all keys) in every backend.
"""

from lumina.attention.attend import attend
from lumina.attention.backend import (
    BACKENDS,
    AttendCall,
    Backend,
    Pairs,
    register_attend_hook,
    register_backend,
)
from lumina.attention.bounds import resolve_seg_bounds
from lumina.attention.kv_cache import CachedStep, KVCache
from lumina.attention.rules import RULES, AttentionRule, Rows, allowed_mask
from lumina.attention.select import AUTO, check_backend_name, resolve_backend
from lumina.attention.spec import AttentionSpec, build_spec

__all__ = [
    "AUTO", "BACKENDS", "RULES", "AttendCall", "AttentionRule", "AttentionSpec", "Backend", "CachedStep",
    "KVCache", "Pairs", "Rows",
    "allowed_mask", "attend", "build_spec", "check_backend_name", "register_attend_hook", "register_backend",
    "resolve_backend", "resolve_seg_bounds",
]
