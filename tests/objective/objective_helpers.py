"""Hand-built model outputs and packs for the objective's unit tests."""

from __future__ import annotations

import torch

from lumina.data.batch import PackedBatch
from lumina.model import LuminaOutput


def HandOutput(**fields: object) -> LuminaOutput:  # noqa: N802 - reads like the dataclass it builds
    """A LuminaOutput filled in by hand with the fields the objective reads (no hidden states)."""
    return LuminaOutput(hidden=torch.empty(0), **fields)


def make_batch(type_ids: list[int], labels: torch.Tensor, num_cols: int = 2, token_valid: list[bool] | None = None,
               noise_t: list[float] | None = None, answer_mask: list[bool] | None = None) -> PackedBatch:
    """A one-segment pack of length S = len(type_ids) whose metadata the objective does not read."""
    seq_len = len(type_ids)
    return PackedBatch(
        input_ids=torch.zeros(1, seq_len, num_cols, dtype=torch.long),
        type_ids=torch.tensor([type_ids]),
        turn_ids=torch.zeros(1, seq_len, dtype=torch.long),
        block_ids=torch.zeros(1, seq_len, dtype=torch.long),
        position_ids=torch.arange(seq_len).unsqueeze(0),
        is_clean=torch.zeros(1, seq_len, dtype=torch.bool),
        token_valid=torch.tensor([token_valid if token_valid is not None else [True] * seq_len]),
        cu_seqlens=torch.tensor([0, seq_len], dtype=torch.int32),
        labels=labels,
        noise_t=None if noise_t is None else torch.tensor([noise_t]),
        answer_mask=None if answer_mask is None else torch.tensor([answer_mask]),
    )
