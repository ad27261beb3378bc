"""`resolve_backend`: what `attn_backend: auto` means on this machine (decided once, when the model is built).

auto -> "flash_varlen" where CUDA is available and flash-attn imports, else "flex" on CUDA, else "segmented".
"""

from __future__ import annotations

import torch

from lumina.attention.backends import flash_varlen
from lumina.attention.spec import BACKENDS

AUTO = "auto"


def flash_attn_imports() -> bool:
    """Whether flash-attn's varlen kernel imported (the flash_varlen backend tried once, at import)."""
    return flash_varlen.flash_attn_varlen_func is not None


def resolve_backend(name: str) -> str:
    """An explicit backend name is returned unchanged; "auto" becomes the best backend this machine serves.
    Raises ValueError naming any other value."""
    if name in BACKENDS:
        return name
    if name != AUTO:
        raise ValueError(f"attn_backend={name!r} is not one of {(AUTO, *BACKENDS)}")
    if not torch.cuda.is_available():
        return "segmented"
    return "flash_varlen" if flash_attn_imports() else "flex"
