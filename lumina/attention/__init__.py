"""Packed block-diffusion attention: the spec built once per forward, the rule, and the backends.

    backend = resolve_backend(config.attn_backend)  # once, when the model is built ("auto" -> this machine's)
    spec = build_spec(batch, backend=backend, strict=config.attn_strict, rule=config.attn_rule)  # per forward
    out = attend(q, k, v, spec)  # per layer: q [B, nh, Lq, hd], k/v [B, nkv, Lk, hd] -> [B, nh, Lq, hd]

Backends (`BACKENDS`, `lumina.attention.backends`): sdpa_dense (the official additive mask, the reference),
segmented, flex, flash_varlen. Rules (`RULES`, `lumina.attention.rules`): full (R1-R8) and simple (S1-S3).
Queries may be fewer than keys (`build_spec(queries, keys=keys)`); `spec.final_rows()` says which key rows
the rule makes final. Rows with token_valid false get the official fully-masked-row result (mean of V over
all keys) in every backend. `allowed_mask` is the dense reference of the rule.
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
from lumina.attention.rules import RULES, AttentionRule, Rows, allowed_mask
from lumina.attention.select import AUTO, check_backend_name, resolve_backend
from lumina.attention.spec import AttentionSpec, build_spec

__all__ = [
    "AUTO", "BACKENDS", "RULES", "AttendCall", "AttentionRule", "AttentionSpec", "Backend", "Pairs", "Rows",
    "allowed_mask", "attend", "build_spec", "check_backend_name", "register_attend_hook", "register_backend",
    "resolve_backend", "resolve_seg_bounds",
]
