"""Which rows of a pack the heads supervise and the one check of its labels (`check_labels`), and `PackRows`,
the one count of a pack that the FLOPs, the throughput callback and the memory estimate read. The rule
(official contract 5.2/5.3): a text-answer row (type 3) is supervised when its column-0 label is not
IGNORE_INDEX; an image-answer row (type 4) when any of its C labels is not."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lumina.contract.batch import PackedBatch
from lumina.contract.roles import IGNORE_INDEX, IMAGE_CODE_TYPES, TokenType


def _supervised(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """A labelled batch -> bool (text [B * S], image [B * S]): the rows each head supervises."""
    types = batch.type_ids.reshape(-1)
    labels = batch.labels.reshape(types.numel(), -1)
    text = (types == TokenType.TEXT_ANSWER) & (labels[:, 0] != IGNORE_INDEX)
    image = (types == TokenType.IMAGE_ANSWER) & (labels != IGNORE_INDEX).any(dim=1)
    return text, image


def check_labels(batch: PackedBatch, vocab_size: int, codebook_size: int,
                 num_codebooks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one check of a labelled batch's label values, where they enter a step (`LuminaModel.forward`).
    -> (text rows [Nt], image rows [Ni]) as flat row indices b * S + s.

    labels [B, S, C] (shape normalised by `PackedBatch`). A supervised type-3 row needs its column-0 target
    in [0, vocab_size); a supervised type-4 row all C labels in [0, codebook_size) with C = num_codebooks;
    no other row may carry labels, nor a type-3 row outside column 0, nor a row with token_valid false.
    Raises ValueError naming the first bad row and its labels. Costs one host sync."""
    types = batch.type_ids.reshape(-1)
    flat = batch.labels.reshape(types.numel(), -1)
    text, image = _supervised(batch)
    labelled = (flat != IGNORE_INDEX).any(-1)
    checks = {
        "other_type": labelled & (types != TokenType.TEXT_ANSWER) & (types != TokenType.IMAGE_ANSWER),
        "text_column": labelled & (types == TokenType.TEXT_ANSWER) & (flat[:, 0] == IGNORE_INDEX),
        "invalid_token": (text | image) & ~batch.token_valid.reshape(-1),
        "text_range": text & ((flat[:, 0] < 0) | (flat[:, 0] >= vocab_size)),
        "image_range": image & ((flat < 0) | (flat >= codebook_size)).any(-1),
        "image_columns": image & (flat.shape[1] != num_codebooks),
    }
    failed = torch.stack([mask.any() for mask in checks.values()]).tolist()  # the one host sync
    for (name, mask), bad in zip(checks.items(), failed, strict=True):
        if bad:
            row = int(mask.nonzero()[0, 0])
            where = (f"labels row {row} (b={row // batch.labels.shape[1]}, s={row % batch.labels.shape[1]}, "
                     f"type {int(types[row])}) = {flat[row].tolist()}")
            why = _LABEL_ERRORS[name].format(vocab_size=vocab_size, codebook_size=codebook_size,
                                             num_codebooks=num_codebooks)
            raise ValueError(f"{where}: {why}")
    return text.nonzero().squeeze(1), image.nonzero().squeeze(1)


_LABEL_ERRORS = {
    "other_type": "only type-3 (text answer) and type-4 (image answer) rows may carry labels other than -100",
    "text_column": ("a type-3 (text answer) row's target is column 0, which is -100 while other columns are "
                    "labelled (the label would be dropped)"),
    "invalid_token": "supervised row has token_valid false",
    "text_range": "text target (column 0) must lie in [0, vocab_size={vocab_size}) or be -100",
    "image_range": ("a supervised image row needs all codebook labels in [0, codebook_size={codebook_size}) "
                    "(valid image labels must be non-negative, all C of them; legacy one-column labels cannot "
                    "supervise images)"),
    "image_columns": "a supervised image row needs num_codebooks={num_codebooks} label columns",
}


def segment_lengths(batch: PackedBatch) -> list[int]:
    """The pack's segment lengths (from seg_bounds, else one host read of cu_seqlens)."""
    bounds = batch.seg_bounds if batch.seg_bounds is not None else batch.cu_seqlens.tolist()
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def is_image_code_row(type_ids: torch.Tensor) -> torch.Tensor:
    """type_ids [...] -> bool [...]: rows whose C columns are image codes (types 2 and 4)."""
    return (type_ids == IMAGE_CODE_TYPES[0]) | (type_ids == IMAGE_CODE_TYPES[1])


def int_at_least(name: str, value: object, low: int) -> int:
    """`value` when it is an int >= low (not a bool), else ValueError naming `name` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    return value


def _fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value!r}: must be a number in [0, 1]")
    return float(value)


@dataclass(frozen=True)
class PackRows:
    """What one pack holds."""

    positions: int  # every row runs through the backbone, tail padding too
    text: int  # supervised text rows (the text head's)
    image: int  # supervised image rows (the image head's and the codebook heads')
    image_inputs: int  # image input rows (types 2 and 4, embedded through the codebook tables)
    # sum(L_i^2) / positions over the segments: the segmented backend computes positions x segment_len pairs
    segment_len: int

    def __post_init__(self) -> None:
        for name in ("positions", "segment_len"):
            int_at_least(f"PackRows.{name}", getattr(self, name), 1)
        for name in ("text", "image", "image_inputs"):
            int_at_least(f"PackRows.{name}", getattr(self, name), 0)
        if self.text + self.image > self.positions or self.image_inputs > self.positions:
            raise ValueError(f"PackRows: text {self.text} + image {self.image} rows, image inputs "
                             f"{self.image_inputs}: more rows than positions={self.positions}")

    @classmethod
    def of(cls, batch: PackedBatch) -> PackRows:
        """The counts of a batch (no supervised rows without labels), as `LuminaModel.forward` selects them."""
        text, image = _supervised(batch) if batch.labels is not None else (batch.type_ids.new_zeros(0),) * 2
        inputs = is_image_code_row(batch.type_ids)
        positions = batch.type_ids.numel()
        squares = sum(length * length for length in segment_lengths(batch))
        text, image, inputs = torch.stack([text.sum(), image.sum(), inputs.sum()]).tolist()
        return cls(positions, text, image, inputs, max(1, squares // positions))

    @classmethod
    def assume(cls, seq_len: int, text_rows: float = 0.25, image_rows: float = 0.5,
               image_input_rows: float = 1.0, segment_len: int = 2048) -> PackRows:
        """Rows from fractions of seq_len (conf/train.yaml's memory_pack; image inputs at least the
        supervised image rows, segment_len at most seq_len)."""
        int_at_least("PackRows.positions", seq_len, 1)
        text = _fraction("memory_pack.text_rows", text_rows)
        image = _fraction("memory_pack.image_rows", image_rows)
        inputs = _fraction("memory_pack.image_input_rows", image_input_rows)
        if text + image > 1.0:
            raise ValueError(f"memory_pack.text_rows={text} + memory_pack.image_rows={image}: a row is one or "
                             "the other, so at most 1 together")
        int_at_least("memory_pack.segment_len", segment_len, 1)
        return cls(seq_len, round(text * seq_len), round(image * seq_len), round(max(inputs, image) * seq_len),
                   min(segment_len, seq_len))
