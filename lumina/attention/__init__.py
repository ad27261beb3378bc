"""Packed block-diffusion attention: the spec built once per forward, the rule, and the backends."""

from lumina.attention.attend import attend
from lumina.attention.bounds import resolve_seg_bounds
from lumina.attention.counters import backend_calls, reset_backend_calls
from lumina.attention.rules import allowed_mask
from lumina.attention.spec import BACKENDS, AttentionSpec, build_spec

__all__ = [
    "BACKENDS",
    "AttentionSpec",
    "allowed_mask",
    "attend",
    "backend_calls",
    "build_spec",
    "reset_backend_calls",
    "resolve_seg_bounds",
]
