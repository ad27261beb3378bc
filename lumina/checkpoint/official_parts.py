"""Which research parts the official split layout can hold: the released model's own only.

`OFFICIAL_PART_FIELDS` pairs each `LuminaConfig` field that names a part with that kind's registry (one line
per kind of part). A model built from another part (a softmax router, a parallel codebook head, ...) is
exported in lumina's fused layout, which records the part names in config.json; the split layout, the one the
official loader reads, refuses it, naming the field and the part.
"""

from __future__ import annotations

from lumina.attention.rules import RULES
from lumina.model.config import LuminaConfig
from lumina.model.image_heads import IMAGE_HEADS
from lumina.model.routers import ROUTERS
from lumina.parts import Registry
from lumina.schedules import SCHEDULES

OFFICIAL_PART_FIELDS: tuple[tuple[str, Registry], ...] = (
    ("score_function", ROUTERS),
    ("image_head", IMAGE_HEADS),
    ("masking_schedule", SCHEDULES),
    ("attn_rule", RULES),
)


def unofficial_parts(config: LuminaConfig) -> list[str]:
    """`field=name` of every part of `config` the released model does not use (empty: all official)."""
    return [f"{field}={getattr(config, field)!r}" for field, registry in OFFICIAL_PART_FIELDS
            if not registry.is_official(getattr(config, field))]


def check_official_parts(config: LuminaConfig, layout: str) -> None:
    """Raise ValueError naming each non-official part when `layout` is the official split layout."""
    if layout != "split":
        return
    parts = unofficial_parts(config)
    if parts:
        raise ValueError(f"layout='split' is the official loader's layout and holds only the released model's "
                         f"parts; this model has {', '.join(parts)}: export it with layout='fused' "
                         "(lumina's own layout, which lumina's reader loads)")
