"""`SpecialTokens`: every special id the layout writes, plus the token-space sizes it validates against.

Text ids index the word vocabulary (`text_vocab_size`); image-code ids the per-codebook image tables
(`image_vocab_size`: codes 0..codebook_size-1, markers above). `official()` gives the InternLumina-U2 values
(contract section 7). The template's tokens (`TEMPLATE_FIELDS`) are -1 where a vocabulary has none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Fields holding ids of the text vocabulary / of the image-code tables.
TEXT_ID_FIELDS = (
    "pad", "text_mask", "boa", "eoa", "boi", "eoi", "bov", "eov", "bo3d", "eo3d",
    "system_open", "system_close", "user_open", "user_close", "uncondition",
)
# Text ids of the prompt template (`lumina.data.layout_pieces.user_content`); -1 = not in the vocabulary.
TEMPLATE_FIELDS = ("img_context", "video_context", "mesh3d_context", "newline")
UNSET = -1
# Media kind -> the placeholder field that stands for it in user text (official <IMG_CONTEXT> etc.)
PLACEHOLDER_FIELDS = {"image": "img_context", "video": "video_context", "mesh3d": "mesh3d_context"}
IMAGE_ID_FIELDS = (
    "image_mask", "image_row_end", "mesh3d_row_end", "mesh3d_layer_end", "video_row_end", "video_group_end",
)


@dataclass(frozen=True)
class SpecialTokens:
    """Fields in order: TEXT_ID_FIELDS, TEMPLATE_FIELDS, IMAGE_ID_FIELDS, then the token-space sizes."""

    pad: int = 156892
    text_mask: int = 156895
    boa: int = 157165
    eoa: int = 157166
    boi: int = 157167
    eoi: int = 157168
    bov: int = 157171
    eov: int = 157172
    bo3d: int = 157169
    eo3d: int = 157170
    system_open: int = 157153
    system_close: int = 157154
    user_open: int = 157155
    user_close: int = 157157
    uncondition: int = 157156
    img_context: int = UNSET
    video_context: int = UNSET
    mesh3d_context: int = UNSET
    newline: int = UNSET
    image_mask: int = 5000
    image_row_end: int = 5001
    mesh3d_row_end: int = 5002
    mesh3d_layer_end: int = 5003
    video_row_end: int = 5004
    video_group_end: int = 5005
    text_vocab_size: int = 157184
    image_vocab_size: int = 5010
    codebook_size: int = 4096
    num_codebooks: int = 8

    @classmethod
    def official(cls, newline: int = UNSET) -> SpecialTokens:
        """The released model's ids and sizes; `newline` is the official tokenizer's id of "\n"."""
        return cls(img_context=157160, video_context=157161, mesh3d_context=157158, newline=newline)

    @classmethod
    def from_record(cls, fields: dict, where: str) -> SpecialTokens:
        """SpecialTokens from a dataset's record; one without TEMPLATE_FIELDS (older data) is refused."""
        missing = [f for f in TEMPLATE_FIELDS if f not in fields]
        if missing:
            raise ValueError(f"{where}: special tokens recorded without {missing}: the data predates the prompt "
                             "template (media placeholders, a '\\n' after a media line, per-task system prompts); "
                             "rebuild it with this version of lumina-data")
        return cls(**fields)

    def placeholder(self, kind: str) -> int:
        """The placeholder id of media `kind` (UNSET when the vocabulary has none)."""
        return getattr(self, PLACEHOLDER_FIELDS[kind])

    def __post_init__(self) -> None:
        for name in ("text_vocab_size", "image_vocab_size", "codebook_size", "num_codebooks"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SpecialTokens.{name}={getattr(self, name)}: must be positive")
        if self.codebook_size > self.image_vocab_size:
            raise ValueError(f"SpecialTokens.codebook_size={self.codebook_size} exceeds "
                             f"image_vocab_size={self.image_vocab_size}")
        for name in TEXT_ID_FIELDS:
            value = getattr(self, name)
            if not 0 <= value < self.text_vocab_size:
                raise ValueError(f"SpecialTokens.{name}={value}: outside the text vocabulary "
                                 f"[0, {self.text_vocab_size})")
        for name in IMAGE_ID_FIELDS:
            value = getattr(self, name)
            if not self.codebook_size <= value < self.image_vocab_size:
                raise ValueError(f"SpecialTokens.{name}={value}: must lie in [codebook_size="
                                 f"{self.codebook_size}, image_vocab_size={self.image_vocab_size}) "
                                 f"so it never collides with a code")
        for name in TEMPLATE_FIELDS:
            value = getattr(self, name)
            if value != UNSET and not 0 <= value < self.text_vocab_size:
                raise ValueError(f"SpecialTokens.{name}={value}: outside the text vocabulary [0, "
                                 f"{self.text_vocab_size}) (use {UNSET} for none)")
        for fields in (TEXT_ID_FIELDS + TEMPLATE_FIELDS, IMAGE_ID_FIELDS):
            seen: dict[int, str] = {}
            for name in fields:
                value = getattr(self, name)
                if value == UNSET and name in TEMPLATE_FIELDS:
                    continue
                if value in seen:
                    raise ValueError(f"SpecialTokens.{name}={value}: same id as {seen[value]}")
                seen[value] = name

    @property
    def structural_text_ids(self) -> frozenset[int]:
        """Ids the layout itself places; a sample's own text must not contain them."""
        return frozenset(getattr(self, n) for n in (
            "pad", "text_mask", "boa", "eoa", "boi", "eoi", "bov", "eov", "bo3d", "eo3d"))

    def replace(self, **changes: int) -> SpecialTokens:
        return dataclasses.replace(self, **changes)
