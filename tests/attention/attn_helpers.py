"""Pack builders for the attention tests (a helper module, not conftest: `from conftest import` resolves to
whichever conftest pytest loaded last when several test folders are given)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from lumina.contract import PackedBatch

C, N = True, False  # is_clean values, for readable hand-built packs


def pack(rows: list[tuple[int, int, int, bool]], cu: list[int], seq_len: int | None = None,
         invalid: tuple[int, ...] = ()) -> PackedBatch:
    """Hand-built pack from rows (type, turn, block, is_clean); positions >= cu[-1] and `invalid` are invalid.
    `seq_len` > len(rows) appends tail padding rows (type 0, turn 0, block -1, clean)."""
    seq_len = seq_len or len(rows)
    rows = rows + [(0, 0, -1, C)] * (seq_len - len(rows))
    types, turns, blocks, clean = (torch.tensor(col) for col in zip(*rows, strict=True))
    valid = torch.arange(seq_len) < cu[-1]
    valid[list(invalid)] = False
    return PackedBatch(
        input_ids=torch.zeros(seq_len, 8, dtype=torch.long), type_ids=types, turn_ids=turns, block_ids=blocks,
        position_ids=torch.arange(seq_len), is_clean=clean, token_valid=valid,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
    )


def random_pack(seed: int, lengths: list[int], tail: int = 0, full_rules: bool = True,
                invalid_frac: float = 0.05) -> PackedBatch:
    """Random block-diffusion metadata in segments of `lengths`, plus `tail` padding positions."""
    g = torch.Generator().manual_seed(seed)
    seq_len = sum(lengths) + tail
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    types = torch.randint(0, 5, (seq_len,), generator=g)
    turns = torch.randint(0, 3, (seq_len,), generator=g)
    blocks = torch.randint(0 if full_rules else -1, 3 if full_rules else 0, (seq_len,), generator=g)
    clean = torch.rand(seq_len, generator=g) < 0.5
    valid = (torch.rand(seq_len, generator=g) >= invalid_frac) & (torch.arange(seq_len) < cu[-1])
    return PackedBatch(
        input_ids=torch.zeros(seq_len, 8, dtype=torch.long), type_ids=types, turn_ids=turns, block_ids=blocks,
        position_ids=torch.arange(seq_len), is_clean=clean, token_valid=valid,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32), seg_bounds=tuple(cu),
    )


@contextmanager
def forbid_host_reads(monkeypatch: pytest.MonkeyPatch, where: str) -> Iterator[None]:
    """Inside the block, any read of a tensor's values on the host raises AssertionError naming `where`."""
    def host_read(*args, **kwargs):
        raise AssertionError(f"host read {where}")

    with monkeypatch.context() as patch:
        for name in ("tolist", "item", "__bool__", "nonzero", "__int__", "__index__"):
            patch.setattr(torch.Tensor, name, host_read)
        patch.setattr(torch, "nonzero", host_read)
        yield
