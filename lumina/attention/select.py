"""`resolve_backend`: `attn_backend: auto` -> flash_varlen where CUDA and flash-attn are available, else flex
on CUDA, else segmented (the highest `auto_rank` whose `auto_here()` holds), once when the model is built."""

from __future__ import annotations

from lumina.attention.backend import BACKENDS, backend_class
from lumina.attention.rules import AUTO


def resolve_backend(name: str, field: str = "attn_backend") -> str:
    """An explicit backend name (or dotted path) is returned unchanged; "auto" becomes the best backend this
    machine serves. Raises ValueError naming `field`, the value and the registered names otherwise."""
    if name != AUTO:
        backend_class(name, field)
        return name
    ranked = [backend_class(n) for n in BACKENDS.names()]
    ranked = [cls for cls in ranked if cls.auto_rank is not None and cls.auto_here()]
    if not ranked:
        raise ValueError(f"{field}=auto: no registered attention backend serves this machine "
                         f"({', '.join(BACKENDS.names())})")
    return max(ranked, key=lambda cls: cls.auto_rank).name


def check_backend_name(name: str, field: str = "attn_backend") -> None:
    """Raise ValueError naming `field` unless `name` is "auto" or names a backend."""
    if name != AUTO:
        backend_class(name, field)
