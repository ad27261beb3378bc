"""Hand-made packed batches for the model tests."""

from __future__ import annotations

import torch

from lumina.contract.batch import PackedBatch

C = 4  # codebooks of the tiny config


def make_batch(types: list[int], *, labelled: bool = True, seed: int = 0, clean: bool = True,
               vocab: int = 512, codebook: int = 64, query_rows: list[int] | None = None) -> PackedBatch:
    """One segment, all valid. Text rows: ids in column 0 (repeated in every column); image rows (2/4): C codes.
    With `labelled`, type-3 rows get a text label in column 0 and type-4 rows C code labels.
    `clean` = every token clean, one turn: fully bidirectional attention."""
    g = torch.Generator().manual_seed(seed)
    seq = len(types)
    type_ids = torch.tensor(types)
    text = torch.randint(1, vocab, (seq, 1), generator=g).expand(seq, C)
    codes = torch.randint(0, codebook, (seq, C), generator=g)
    is_image = (type_ids == 2) | (type_ids == 4)
    input_ids = torch.where(is_image[:, None], codes, text).clone()
    labels = None
    if labelled:
        labels = torch.full((seq, C), -100)
        labels[type_ids == 3, 0] = torch.randint(0, vocab, (int((type_ids == 3).sum()),), generator=g)
        labels[type_ids == 4] = torch.randint(0, codebook, (int((type_ids == 4).sum()), C), generator=g)
    return PackedBatch(
        input_ids=input_ids, type_ids=type_ids, turn_ids=torch.zeros(seq, dtype=torch.long),
        block_ids=torch.full((seq,), -1), position_ids=torch.arange(seq),
        is_clean=torch.full((seq,), clean), token_valid=torch.ones(seq, dtype=torch.bool),
        cu_seqlens=torch.tensor([0, seq], dtype=torch.int32), labels=labels,
        query_rows=None if query_rows is None else torch.tensor(query_rows),
    )


MIXED_TYPES = [1, 1, 2, 2, 1, 3, 3, 3, 1, 4, 4, 4, 4, 3]
