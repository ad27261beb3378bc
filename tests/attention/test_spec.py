"""Validation in `build_spec`, `resolve_seg_bounds` and the PackedBatch id-dtype contract."""

from __future__ import annotations

import pytest
import torch
from attn_helpers import C, pack, random_pack

from lumina.attention import build_spec, resolve_seg_bounds
from lumina.contract import PackedBatch


def test_resolve_seg_bounds():
    assert resolve_seg_bounds(torch.tensor([0, 3, 7], dtype=torch.int32), 8) == (0, 3, 7)
    assert resolve_seg_bounds(torch.tensor([0, 8]), 8) == (0, 8)
    assert resolve_seg_bounds(None, 8) is None
    assert resolve_seg_bounds(torch.zeros(0, dtype=torch.int32), 8) is None
    assert resolve_seg_bounds(torch.tensor([0]), 8) is None  # one entry: no segment (official: not packed)


@pytest.mark.parametrize(("cu", "message"), [
    ([1, 4], r"must start at 0, got cu_seqlens\[0\]=1"),
    ([0, 4, 4, 6], r"strictly increase, got cu_seqlens\[1\]=4 >= cu_seqlens\[2\]=4"),
    ([0, 5, 3], r"strictly increase, got cu_seqlens\[1\]=5 >= cu_seqlens\[2\]=3"),
    ([0, 9], r"end at or before S=8, got cu_seqlens\[-1\]=9"),
])
def test_bad_cu_seqlens_raise(cu, message):
    with pytest.raises(ValueError, match=message):
        resolve_seg_bounds(torch.tensor(cu), 8)
    batch = pack([(1, 0, -1, C)] * 8, cu=[0, 8])
    batch.cu_seqlens = torch.tensor(cu, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        build_spec(batch)


@pytest.mark.parametrize("cu", [[0], []])
def test_pack_without_a_segment_raises(cu):
    batch = pack([(1, 0, -1, C)] * 8, cu=[0, 8])
    batch.cu_seqlens = torch.tensor(cu, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"cu_seqlens must hold at least 2 entries .*got \[{cu[0] if cu else ''}\]"):
        build_spec(batch)


def test_float_cu_seqlens_raise():
    with pytest.raises(ValueError, match="cu_seqlens has dtype torch.float32"):
        resolve_seg_bounds(torch.tensor([0.0, 4.0]), 8)
    with pytest.raises(ValueError, match="cu_seqlens must be 1-D"):
        resolve_seg_bounds(torch.tensor([[0, 4]]), 8)
    with pytest.raises(ValueError, match=r"cu_seqlens must hold integers, got \[2.5\]"):
        resolve_seg_bounds([0, 2.5, 4], 8)
    assert resolve_seg_bounds([0, 2.0, 4], 8) == (0, 2, 4)  # integral floats are exact
    with pytest.raises(ValueError, match=r"cu_seqlens has non-integral values, e.g. \[2.5\]"):
        _batch(cu_seqlens=[0, 2.5, 4])
    with pytest.raises(ValueError, match=r"seg_bounds must hold integers, got \[2.5\]"):
        _batch(cu_seqlens=[0, 2, 4], seg_bounds=(0, 2.5, 4))


def test_valid_tail_raises():
    batch = pack([(1, 0, -1, C)] * 8, cu=[0, 5])
    batch.token_valid[0, 6] = True
    with pytest.raises(ValueError, match=r"token_valid is true at tail positions \[6\] after cu_seqlens\[-1\]=5"):
        build_spec(batch)


def test_seg_bounds_must_match_cu_seqlens():
    batch = pack([(1, 0, -1, C)] * 8, cu=[0, 3, 8])
    batch.seg_bounds = (0, 4, 8)
    with pytest.raises(ValueError, match=r"seg_bounds \[0, 4, 8\] disagree with cu_seqlens \[0, 3, 8\]"):
        build_spec(batch)
    batch.seg_bounds = (0, 8)
    with pytest.raises(ValueError, match="cu_seqlens has shape"):
        build_spec(batch)
    batch.seg_bounds = (0, 3, 9)
    with pytest.raises(ValueError, match=r"seg_bounds must end at or before S=8"):
        build_spec(batch)


def test_metadata_length_mismatch_raises():
    batch = pack([(1, 0, -1, C)] * 8, cu=[0, 8])
    batch.turn_ids = torch.zeros(1, 7, dtype=torch.long)
    with pytest.raises(ValueError, match=r"turn_ids has shape \[1, 7\], expected \[1, S=8\]"):
        build_spec(batch)
    fields = dict(input_ids=torch.zeros(8, dtype=torch.long), type_ids=torch.ones(8, dtype=torch.long),
                  turn_ids=torch.zeros(8, dtype=torch.long), block_ids=torch.zeros(7, dtype=torch.long),
                  position_ids=torch.arange(8), is_clean=torch.ones(8, dtype=torch.bool),
                  token_valid=torch.ones(8, dtype=torch.bool), cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match=r"disagree in length \(rows S\): input_ids 8, type_ids 8, turn_ids 8, "
                                         r"block_ids 7, position_ids 8, is_clean 8, token_valid 8$"):
        PackedBatch(**fields)
    # a short type_ids is named as such (S is not taken from it), beside every other field's length
    with pytest.raises(ValueError, match=r"input_ids 8, labels 8, type_ids 6, turn_ids 8"):
        PackedBatch(**{**fields, "block_ids": torch.zeros(8, dtype=torch.long), "type_ids": torch.ones(6),
                       "labels": torch.zeros(8, 1, dtype=torch.long)})


def _batch(**override) -> PackedBatch:
    fields = dict(input_ids=torch.zeros(4, 8, dtype=torch.long), type_ids=torch.ones(4, dtype=torch.long),
                  turn_ids=torch.zeros(4, dtype=torch.long), block_ids=torch.zeros(4, dtype=torch.long),
                  position_ids=torch.arange(4), is_clean=torch.ones(4, dtype=torch.bool),
                  token_valid=torch.ones(4, dtype=torch.bool), cu_seqlens=torch.tensor([0, 4]))
    fields.update(override)
    return PackedBatch(**fields)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids"])
def test_half_float_ids_raise(name, dtype):
    value = _batch(labels=torch.zeros(4, 8, dtype=torch.long)).__dict__[name].to(dtype)
    with pytest.raises(ValueError, match=f"{name} has dtype {dtype}"):
        _batch(**{name: value})


def test_float32_ids():
    batch = _batch(type_ids=torch.tensor([1.0, 2.0, 3.0, 4.0]), labels=torch.full((4, 8), -100.0))
    assert batch.type_ids.dtype == torch.int64 and batch.type_ids.tolist() == [[1, 2, 3, 4]]
    assert batch.labels.dtype == torch.int64 and batch.labels.shape == (1, 4, 8)
    with pytest.raises(ValueError, match=r"type_ids has non-integral values, e.g. \[1.5\]"):
        _batch(type_ids=torch.tensor([1.0, 1.5, 3.0, 4.0]))
    with pytest.raises(ValueError, match="input_ids has values >= 2"):
        _batch(input_ids=torch.full((4, 8), float(2**24)))
    widened = _batch(input_ids=torch.full((4, 8), 157166, dtype=torch.int32))
    assert widened.input_ids.dtype == torch.int64 and int(widened.input_ids[0, 0, 0]) == 157166


def test_flags_must_be_zero_one():
    assert _batch(is_clean=torch.tensor([0, 1, 1, 0])).is_clean.tolist() == [[False, True, True, False]]
    with pytest.raises(ValueError, match="is_clean must be 0/1"):
        _batch(is_clean=torch.tensor([0, 2, 1, 0]))


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="attn_backend='xformers': no attention backend of that name"):
        build_spec(random_pack(0, [4]), backend="xformers")


def test_spec_facts():
    batch = random_pack(0, [5, 7], tail=2)
    spec = build_spec(batch)
    assert spec.bounds == (0, 5, 12) and spec.seq_len == 14
    assert spec.queries.seg_id[0].tolist() == [0] * 5 + [1] * 7 + [2] * 2
    assert type(spec.rule).__name__ == "FullRules" and spec.num_invalid > 0  # auto: block ids in use
    batch.block_ids.fill_(-1)
    batch.token_valid[0, :12] = True
    spec = build_spec(batch)
    assert type(spec.rule).__name__ == "SimpleRules" and spec.num_invalid > 0  # the tail stays invalid
    assert type(build_spec(batch, rule="full").rule).__name__ == "FullRules"  # a named rule is kept


def test_segments_come_from_cu_seqlens_not_position_restarts():
    """The clean answer memory restarts position ids inside a sample: still one segment."""
    batch = pack([(1, 0, -1, C)] * 6, cu=[0, 6])
    batch.position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]])
    spec = build_spec(batch, backend="segmented")
    assert spec.bounds == (0, 6) and spec.queries.seg_id.tolist() == [[0] * 6]
    assert spec.allowed(slice(0, 6), slice(0, 6)).all()  # clean, one turn: every pair, across the restart
