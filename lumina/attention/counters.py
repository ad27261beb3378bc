"""Per-backend call counters: proof of which code path served each `attend` call."""

from __future__ import annotations

from collections import Counter

_CALLS: Counter[str] = Counter()


def count(name: str) -> None:
    _CALLS[name] += 1


def backend_calls() -> dict[str, int]:
    """Calls served per backend since the last reset; fallbacks also count as "fallback:<from>-><to>"."""
    return dict(_CALLS)


def reset_backend_calls() -> None:
    _CALLS.clear()
