"""Best-fit packing (shuffled and longest-first placement) and pack collation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_packing import reference_best_fit

from lumina.contract.training_sequence import TrainingSequence
from lumina.data.packing import best_fit, collate_pack

PAD = 156892


def naive_best_fit_loads(lengths: list[int], seq_len: int) -> list[int]:
    """Reference best fit over `lengths` in the given order: each into the open pack with least room that
    fits (linear scan)."""
    loads: list[int] = []
    for n in lengths:
        fits = [p for p, used in enumerate(loads) if seq_len - used >= n]
        if fits:
            best = min(fits, key=lambda p: seq_len - loads[p])
            loads[best] += n
        else:
            loads.append(n)
    return sorted(loads)


def long_tailed(n: int, seq_len: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(seq_len / 12), 1.0, n), 1, seq_len).astype(int).tolist()


def test_hand_example() -> None:
    # 5 -> A (room 3); 4 -> B (room 4); 3 -> A (best fit, room 0); 3 -> B (room 1); 2 -> C (room 6); 1 -> B
    lengths = [3, 5, 1, 4, 2, 3]
    p = best_fit(lengths, 8, np.random.default_rng(0), "longest_first")
    contents = sorted(sorted(lengths[i] for i in pack) for pack in packs_of(p))
    assert contents == [[1, 3, 4], [2], [3, 5]]
    assert sorted(p.pack_tokens) == [2, 8, 8]
    assert p.fill_ratio == pytest.approx(18 / 24)
    assert p.skipped.tolist() == []


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("seq_len", [64, 1000])
@pytest.mark.parametrize("order", ["shuffled", "longest_first"])
def test_invariants_and_reference(seed: int, seq_len: int, order: str) -> None:
    lengths = long_tailed(400, seq_len, seed)
    p = best_fit(lengths, seq_len, np.random.default_rng(seed), order)  # type: ignore[arg-type]
    flat = [i for pack in packs_of(p) for i in pack]
    assert sorted(flat) == list(range(len(lengths)))  # every sample exactly once, none split
    for pack, tokens in zip(packs_of(p), p.pack_tokens, strict=True):
        assert sum(lengths[i] for i in pack) == tokens <= seq_len
    assert p.fill_ratio == pytest.approx(sum(lengths) / (p.num_packs * seq_len))
    placed = ([lengths[i] for i in np.random.default_rng(seed).permutation(len(lengths))] if order == "shuffled"
              else sorted(lengths, reverse=True))
    assert sorted(p.pack_tokens) == naive_best_fit_loads(placed, seq_len)
    assert p.num_packs >= -(-sum(lengths) // seq_len)


@pytest.mark.parametrize("order", ["shuffled", "longest_first"])
def test_equal_lengths_ordered_by_seed(order: str) -> None:
    lengths = [4] * 12
    a = best_fit(lengths, 8, np.random.default_rng(1), order)  # type: ignore[arg-type]
    b = best_fit(lengths, 8, np.random.default_rng(1), order)  # type: ignore[arg-type]
    c = best_fit(lengths, 8, np.random.default_rng(2), order)  # type: ignore[arg-type]
    assert packs_of(a) == packs_of(b)
    assert packs_of(a) != packs_of(c)
    assert sorted(a.pack_tokens) == [8] * 6


def test_shuffled_mixes_lengths_that_longest_first_groups() -> None:
    """Two kinds of sample (long 16, short 4): longest first packs the long ones in pairs, then the short
    ones; the shuffled order puts both kinds in most packs, at a similar fill."""
    lengths = [16] * 40 + [4] * 80
    kinds = {}
    for order in ("shuffled", "longest_first"):
        p = best_fit(lengths, 32, np.random.default_rng(0), order)  # type: ignore[arg-type]
        kinds[order] = sum(len({lengths[i] for i in pack}) == 2 for pack in packs_of(p)) / p.num_packs
        assert p.fill_ratio > 0.9
    assert kinds["longest_first"] == 0
    assert kinds["shuffled"] >= 0.6


def test_overlong_error_names_sample() -> None:
    with pytest.raises(ValueError, match=r"sample s2 \(index 2\) has laid-out length 9 > seq_len=8"):
        best_fit([3, 8, 9, 10], 8, np.random.default_rng(0), sample_id=lambda i: f"s{i}")


def test_overlong_skip_counts() -> None:
    lengths = [3, 8, 9, 10, 5]
    p = best_fit(lengths, 8, np.random.default_rng(0), overlong="skip")
    assert p.skipped.tolist() == [2, 3]
    assert sorted(i for pack in packs_of(p) for i in pack) == [0, 1, 4]


@pytest.mark.parametrize("bad", [[3, 0], [-1]])
def test_nonpositive_length_raises(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        best_fit(bad, 8, np.random.default_rng(0))


def test_bad_policy_raises() -> None:
    with pytest.raises(ValueError, match="overlong='truncate'"):
        best_fit([1], 8, np.random.default_rng(0), overlong="truncate")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="order='sorted'"):
        best_fit([1], 8, np.random.default_rng(0), "sorted")  # type: ignore[arg-type]


def make_seq(sid: str, n: int, base: int, c: int = 2) -> TrainingSequence:
    ids = torch.arange(base, base + n * c).view(n, c)
    return TrainingSequence(
        sample_id=sid, input_ids=ids, labels=ids + 1000, type_ids=torch.full((n,), 3),
        turn_ids=torch.full((n,), 1), block_ids=torch.full((n,), 2), position_ids=torch.arange(n) + 5,
        is_clean=torch.ones(n, dtype=torch.bool), noise_t=torch.full((n,), 0.25),
        answer_mask=torch.ones(n, dtype=torch.bool))


def test_collate_concatenates_and_pads() -> None:
    a, b = make_seq("a", 3, 0), make_seq("b", 2, 100)
    batch = collate_pack([a, b], 8, PAD, 2)
    assert batch.cu_seqlens.tolist() == [0, 3, 5]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.seg_bounds == (0, 3, 5)
    assert batch.input_ids.shape == (1, 8, 2)
    assert batch.input_ids[0, :3].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert batch.input_ids[0, 3:5].tolist() == [[100, 101], [102, 103]]
    assert batch.input_ids[0, 5:].tolist() == [[PAD, PAD]] * 3
    assert batch.labels[0, :5].tolist() == [[1000, 1001], [1002, 1003], [1004, 1005], [1100, 1101], [1102, 1103]]
    assert batch.labels[0, 5:].tolist() == [[-100, -100]] * 3
    assert batch.token_valid[0].tolist() == [True] * 5 + [False] * 3
    assert batch.type_ids[0].tolist() == [3] * 5 + [0] * 3
    assert batch.turn_ids[0].tolist() == [1] * 5 + [0] * 3
    assert batch.block_ids[0].tolist() == [2] * 5 + [-1] * 3
    assert batch.position_ids[0].tolist() == [5, 6, 7, 5, 6, 0, 0, 0]
    assert batch.is_clean[0].tolist() == [True] * 5 + [False] * 3
    assert batch.answer_mask[0].tolist() == [True] * 5 + [False] * 3
    assert batch.noise_t[0].tolist() == [0.25] * 5 + [0.0] * 3


def test_all_padding_pack() -> None:
    batch = collate_pack([], 4, PAD, 8)
    assert batch.cu_seqlens.tolist() == [0, 4] and batch.seg_bounds == (0, 4)  # one segment, all padding
    assert batch.input_ids.shape == (1, 4, 8)
    assert (batch.input_ids == PAD).all() and (batch.labels == -100).all()
    assert not batch.token_valid.any() and not batch.is_clean.any()
    assert (batch.block_ids == -1).all() and (batch.type_ids == 0).all()


def test_collate_errors() -> None:
    with pytest.raises(ValueError, match=r"pack holds 9 tokens > seq_len=8"):
        collate_pack([make_seq("a", 5, 0), make_seq("b", 4, 0)], 8, PAD, 2)
    with pytest.raises(ValueError, match=r"sample a: input_ids has shape \[3, 2\], expected \[3, 8\]"):
        collate_pack([make_seq("a", 3, 0)], 8, PAD, 8)
    two_d = make_seq("t", 3, 0)
    two_d.type_ids = two_d.type_ids.view(3, 1)
    with pytest.raises(ValueError, match=r"sample t: type_ids has shape \[3, 1\], expected \[3\]"):
        collate_pack([two_d], 8, PAD, 2)


def packs_of(p) -> list[tuple[int, ...]]:
    return [p.pack(k) for k in range(p.num_packs)]


@pytest.mark.parametrize("order", ["shuffled", "longest_first"])
def test_same_packs_as_the_reference_packer(order: str) -> None:
    """The compiled packer against the pure-Python one it replaced, on 300 random cases: the same members in
    the same order, the same tokens, the same skipped samples (short, long-tailed, equal and overlong)."""
    cases = np.random.default_rng(123)
    for case in range(300):
        seq_len = int(cases.choice([1, 7, 63, 64, 65, 1000, 4096, 16384, 70000]))
        n = int(cases.integers(0, 600))
        kind = case % 3
        if kind == 0:
            lengths = cases.integers(1, seq_len + 1, n)
        elif kind == 1:
            lengths = np.clip(cases.lognormal(np.log(max(seq_len / 10, 1)), 1.2, n), 1, 2 * seq_len).astype(int)
        else:
            lengths = cases.choice([1, max(seq_len // 2, 1), seq_len, seq_len + 3], n)
        seed = int(cases.integers(2**32))
        want_packs, want_tokens, want_skipped = reference_best_fit(lengths.tolist(), seq_len,
                                                                   np.random.default_rng(seed), order)
        dtype = cases.choice([np.int64, np.int32, np.uint16] if lengths.max(initial=0) < 2**16 else [np.int64])
        got = best_fit(lengths.astype(dtype), seq_len,
                       np.random.default_rng(seed), order, "skip")  # type: ignore[arg-type]
        assert packs_of(got) == [tuple(m) for m in want_packs], (case, seq_len, n)
        assert got.pack_tokens.tolist() == want_tokens
        assert got.skipped.tolist() == want_skipped
