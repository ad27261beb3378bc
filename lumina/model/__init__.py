"""Single-device InternLumina-U2 model code."""

from lumina.model.config import LuminaConfig

__all__ = ["LuminaConfig"]
