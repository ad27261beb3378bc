"""Attention backends by name: the `Backend` protocol, the `BACKENDS` registry (one module of
`lumina.attention.backends` per backend; a user's own is named by its dotted path), the attend-call hooks."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import torch
from torch.utils.hooks import RemovableHandle

from lumina.parts import Registry

log = logging.getLogger(__name__)

BACKENDS = Registry("attention backend", "lumina.attention.backends")


class Pairs(Enum):
    """Which (query, key) pairs a backend computes, per query head (what `lumina.model.flops` counts)."""

    DENSE = "dense"  # every pair of the pack, masked ones included: Lq * Lk
    SEGMENTS = "segments"  # every pair inside each segment: sum Lq_i * Lk_i
    ALLOWED = "allowed"  # only the pairs the rule allows (block-sparse kernels skip the rest)


class Backend:
    """One way to compute packed block-diffusion attention: set the class variables, implement `forward`.
    name: the registered name (`attn_backend`). devices: torch device types it runs on (`attend` falls back
    on others). pairs: its FLOP convention. plans_runs: `build_spec` decides which runs are plain
    (`spec.run_plain`). auto_rank: `auto` picks the highest rank whose `auto_here()` holds (None: never).
    `spec` is an `AttentionSpec` (typed Any: the spec module reads this registry)."""

    name: ClassVar[str] = ""
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    pairs: ClassVar[Pairs] = Pairs.SEGMENTS
    plans_runs: ClassVar[bool] = False
    auto_rank: ClassVar[int | None] = None

    @classmethod
    def auto_here(cls) -> bool:
        """Whether `auto` may choose this backend on this machine."""
        return False

    @staticmethod
    def unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: Any) -> str | None:
        """Why this backend cannot serve this call (then `attend` falls back or, strict, raises), else None."""
        return None

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: Any) -> torch.Tensor:
        """q [B, nh, Lq, hd] (the spec's query rows), k/v [B, nkv, Lk, hd] (its key rows) -> [B, nh, Lq, hd]."""
        raise NotImplementedError


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Class decorator: register a `Backend` subclass under its `name`."""
    if not cls.name:
        raise ValueError(f"backend class {cls.__qualname__} sets no `name`")
    return BACKENDS.register(cls.name)(cls)


def backend_class(name: str, field: str = "attn_backend") -> type[Backend]:
    """The backend registered as `name` (or at a dotted path); ValueError naming `field` otherwise."""
    if name == "auto":
        raise ValueError(f"{field}='auto' names no backend: resolve it first (lumina.attention.resolve_backend)")
    cls = BACKENDS.get(name, field)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ValueError(f"{field}={name!r}: {cls!r} is not a lumina.attention.backend.Backend subclass")
    return cls


@dataclass(frozen=True)
class AttendCall:
    """One `attend` call: the backend asked for, the one that served, why it fell back (None: it did not)."""

    requested: str
    served: str
    fallback_reason: str | None = None


_HOOKS: OrderedDict[int, Callable[[AttendCall], None]] = OrderedDict()
_WARNED: set[tuple[str, str]] = set()


def register_attend_hook(hook: Callable[[AttendCall], None]) -> RemovableHandle:
    """Call `hook(AttendCall)` after every `attend` call; `.remove()` the returned handle to stop."""
    handle = RemovableHandle(_HOOKS)
    _HOOKS[handle.id] = hook
    return handle


def report(call: AttendCall) -> None:
    """Tell the hooks; log a fallback once per (backend, reason)."""
    if call.fallback_reason is not None and (call.requested, call.fallback_reason) not in _WARNED:
        _WARNED.add((call.requested, call.fallback_reason))
        log.warning("attention backend %r cannot serve this call (%s); falling back to %r (logged once)",
                    call.requested, call.fallback_reason, call.served)
    for hook in tuple(_HOOKS.values()):
        hook(call)
