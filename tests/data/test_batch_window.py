"""`PackedBatch.padded` and `PackedBatch.window`: the row windows sequence parallelism hands each rank."""

from __future__ import annotations

import pytest
import torch

from lumina.attention import build_spec
from lumina.contract.batch import PackedBatch
from lumina.contract.roles import IGNORE_INDEX
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.packing import collate_pack


def sequence(n: int, seed: int, columns: int = 2) -> TrainingSequence:
    gen = torch.Generator().manual_seed(seed)
    types = torch.tensor([1] * (n // 2) + [3] * (n - n // 2))
    labels = torch.full((n, columns), IGNORE_INDEX)
    labels[types == 3, 0] = torch.randint(0, 50, (int((types == 3).sum()),), generator=gen)
    return TrainingSequence(
        sample_id=f"s{seed}", input_ids=torch.randint(1, 50, (n, columns), generator=gen), labels=labels,
        type_ids=types, turn_ids=(types == 3).long(), block_ids=torch.full((n,), -1),
        position_ids=torch.arange(n), is_clean=types == 1, noise_t=(types == 3).float() * 0.5,
        answer_mask=types == 3)


@pytest.fixture
def pack() -> PackedBatch:
    return collate_pack([sequence(5, 1), sequence(4, 2)], seq_len=9, pad_id=7, num_codebooks=2)


def test_padded_appends_the_collators_tail_rows(pack) -> None:
    longer = collate_pack([sequence(5, 1), sequence(4, 2)], seq_len=12, pad_id=7, num_codebooks=2)
    padded = pack.padded(12, pad_id=7)
    for name in ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
                 "token_valid", "noise_t", "answer_mask"):
        assert torch.equal(getattr(padded, name), getattr(longer, name)), name
    assert torch.equal(padded.cu_seqlens, pack.cu_seqlens)
    assert pack.padded(9, pad_id=7) is pack
    with pytest.raises(ValueError, match="already has 9 rows"):
        pack.padded(8, pad_id=7)


def test_windows_tile_the_pack_and_keep_the_whole_packs_spec(pack) -> None:
    padded = pack.padded(10, pad_id=7)
    halves = [padded.window(0, 5), padded.window(5, 10)]
    for name in ("input_ids", "labels", "type_ids", "position_ids", "token_valid", "noise_t"):
        joined = torch.cat([getattr(h, name) for h in halves], dim=1)
        assert torch.equal(joined, getattr(padded, name)), name
    assert all(h.whole is padded and h.seq_len == 5 for h in halves)
    spec = build_spec(halves[1], backend="segmented")
    assert spec.seq_len == 10 and spec.bounds == (0, 5, 9)  # the whole pack's segments
    moved = halves[1].to("cpu")
    assert moved.whole is not None and moved.whole.seq_len == 10


@pytest.mark.parametrize(("start", "stop"), [(0, 0), (3, 2), (-1, 4), (5, 11)])
def test_a_bad_window_names_the_range(pack, start, stop) -> None:
    with pytest.raises(ValueError, match=rf"window \[{start}, {stop}\)"):
        pack.window(start, stop)


def test_windows_do_not_nest(pack) -> None:
    with pytest.raises(ValueError, match="no nested windows"):
        pack.window(0, 4).window(0, 2)
