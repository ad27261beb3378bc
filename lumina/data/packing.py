"""Packing: laid-out sample lengths -> packs of `seq_len` (best fit), and packs -> `PackedBatch`.

`best_fit` only sees lengths, so an epoch's whole plan is computed up front from stored lengths. Samples
are placed in a seeded random order ("shuffled") or longest first ("longest_first", best-fit decreasing,
ties in a seeded order); each goes into the open pack with the least room that still fits it, else into a
new pack. The loop is a numba kernel over NumPy arrays; packs come back as flat arrays (CSR). Timings and
the task mix per pack of both orders: `experiments/bench/data.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numba
import numpy as np
import torch

from lumina.contract.batch import TAIL_FILL, PackedBatch
from lumina.contract.training_sequence import TrainingSequence

OverlongPolicy = Literal["error", "skip"]
OVERLONG_POLICIES = ("error", "skip")
PackOrder = Literal["shuffled", "longest_first"]
PACK_ORDERS = ("shuffled", "longest_first")


@dataclass(frozen=True, eq=False)
class Packing:
    """Packs as flat arrays (CSR): pack p holds samples `members[offsets[p]:offsets[p + 1]]` (int32; int64
    past 2**31 samples) in placement order; skipped: ascending indices of overlong samples ("skip")."""

    seq_len: int
    offsets: np.ndarray  # [num_packs + 1]
    members: np.ndarray  # [packed samples]
    pack_tokens: np.ndarray  # [num_packs]
    skipped: np.ndarray  # [skipped samples]

    @property
    def num_packs(self) -> int:
        return len(self.pack_tokens)

    @property
    def tokens(self) -> int:
        return int(self.pack_tokens.sum())

    @property
    def fill_ratio(self) -> float:
        """Sample tokens / (packs * seq_len); 1.0 for no packs."""
        return self.tokens / (self.num_packs * self.seq_len) if self.num_packs else 1.0

    def pack(self, p: int) -> tuple[int, ...]:
        """Sample indices of pack p, in placement order."""
        return tuple(self.members[self.offsets[p]:self.offsets[p + 1]].tolist())


_ONE, _ALL = np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF)
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_INDEX = np.array([0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43,
                            22, 45, 39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44,
                            32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], np.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def _lowest_bit(word: np.uint64) -> int:
    """Index of the lowest set bit of a nonzero word (de Bruijn multiplication)."""
    return _DEBRUIJN_INDEX[((word & (~word + _ONE)) * _DEBRUIJN) >> np.uint64(58)]


@numba.njit(cache=True, nogil=True, inline="always")
def _set(bits: np.ndarray, summary: np.ndarray, room: int) -> None:
    w = room >> 6
    bits[w] |= _ONE << np.uint64(room & 63)
    summary[w >> 6] |= _ONE << np.uint64(w & 63)


@numba.njit(cache=True, nogil=True, inline="always")
def _clear(bits: np.ndarray, summary: np.ndarray, room: int) -> None:
    w = room >> 6
    bits[w] &= ~(_ONE << np.uint64(room & 63))
    if bits[w] == 0:
        summary[w >> 6] &= ~(_ONE << np.uint64(w & 63))


@numba.njit(cache=True, nogil=True, inline="always")
def _least_room_at_least(bits: np.ndarray, summary: np.ndarray, need: int) -> int:
    """The least room >= need that some open pack has, or -1."""
    w = need >> 6
    word = bits[w] & (_ALL << np.uint64(need & 63))
    if word:
        return (w << 6) + _lowest_bit(word)
    w += 1
    if w >= bits.size:
        return -1
    v = w >> 6
    above = summary[v] & (_ALL << np.uint64(w & 63))
    while above == 0:
        v += 1
        if v >= summary.size:
            return -1
        above = summary[v]
    w = (v << 6) + _lowest_bit(above)
    return (w << 6) + _lowest_bit(bits[w])


@numba.njit(cache=True, nogil=True)
def _best_fit_kernel(placed: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best fit of the lengths `placed` [n], in that order -> (pack of each [n] int32, -1 = longer than
    seq_len; tokens [P] and sample count [P] of each pack).

    Open packs per free room 0..seq_len: a LIFO linked list (`head[room]`, `below[pack]`) and a two-level
    bitset of non-empty rooms; ties go to the most recently opened pack."""
    n, size = placed.size, seq_len + 1
    words = (size + 63) // 64
    bits, summary = np.zeros(words, np.uint64), np.zeros((words + 63) // 64, np.uint64)
    head = np.full(size, -1, np.int32)
    capacity = max(1024, n // 16)
    below, tokens, count = np.empty(capacity, np.int32), np.empty(capacity, np.int64), np.empty(capacity, np.int32)
    assign = np.empty(n, np.int32)
    num_packs = 0
    for k in range(n):
        need = np.int64(placed[k])
        if need > seq_len:
            assign[k] = -1
            continue
        room = _least_room_at_least(bits, summary, need)
        if room < 0:  # none fits: open a new pack
            if num_packs == capacity:
                capacity *= 2
                below, tokens, count = _grow(below, capacity), _grow(tokens, capacity), _grow(count, capacity)
            pack, room = num_packs, seq_len
            tokens[pack] = count[pack] = 0
            num_packs += 1
        else:
            pack = head[room]
            head[room] = below[pack]
            if head[room] < 0:
                _clear(bits, summary, room)
        assign[k] = pack
        tokens[pack] += need
        count[pack] += 1
        left = room - need
        if left > 0:
            if head[left] < 0:
                _set(bits, summary, left)
            below[pack], head[left] = head[left], pack
    return assign, tokens[:num_packs].copy(), count[:num_packs].copy()


@numba.njit(cache=True, nogil=True)
def _grow(a: np.ndarray, capacity: int) -> np.ndarray:
    out = np.empty(capacity, a.dtype)
    out[:a.size] = a
    return out


@numba.njit(cache=True, nogil=True)
def _group_members(assign: np.ndarray, placement: np.ndarray, offsets: np.ndarray, members: np.ndarray) -> None:
    """members[offsets[p]:offsets[p + 1]] = the samples assigned to pack p, in placement order."""
    fill = offsets[:-1].copy()
    for k in range(assign.size):
        p = assign[k]
        if p >= 0:
            members[fill[p]] = placement[k]
            fill[p] += 1


def best_fit(lengths: np.ndarray | Sequence[int], seq_len: int, rng: np.random.Generator,
             order: PackOrder = "shuffled", overlong: OverlongPolicy = "error",
             sample_id: Callable[[int], str] | None = None) -> Packing:
    """Pack samples of the given laid-out lengths [N] into packs of at most `seq_len` tokens, none split.

    A sample longer than `seq_len` raises ValueError naming it ("error") or is listed in `Packing.skipped`
    ("skip"). `rng` draws the placement order ("shuffled") or the order of equal lengths ("longest_first").
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be positive")
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong={overlong!r}: expected one of {OVERLONG_POLICIES}")
    if order not in PACK_ORDERS:
        raise ValueError(f"order={order!r}: expected one of {PACK_ORDERS}")
    lens = np.asarray(lengths).reshape(-1)
    if lens.dtype.kind not in "iu":
        lens = lens.astype(np.int64)
    name = sample_id or (lambda i: f"#{i}")
    if lens.size and lens.min() <= 0:
        i = int(np.argmin(lens))
        raise ValueError(f"sample {name(i)} (index {i}) has laid-out length {int(lens[i])}; lengths must be >= 1")
    too_long = np.flatnonzero(lens > seq_len)
    if too_long.size and overlong == "error":
        i = int(too_long[0])
        raise ValueError(f"sample {name(i)} (index {i}) has laid-out length {int(lens[i])} > seq_len={seq_len} "
                         f"({too_long.size} such samples); raise seq_len or set overlong='skip'")
    placement = rng.permutation(lens.size)
    if order == "longest_first":
        placement = placement[np.argsort(-lens[placement].astype(np.int64), kind="stable")]  # ties: seeded order
    index_type = np.int32 if lens.size < 2**31 else np.int64
    placement = placement.astype(index_type, copy=False)
    # gathered up front, in the narrowest type that holds seq_len + 1 (overlong samples stay overlong)
    narrow_type = np.min_scalar_type(seq_len + 1)
    narrow = (lens if np.can_cast(lens.dtype, narrow_type) else np.minimum(lens, seq_len + 1)).astype(narrow_type)
    assign, tokens, count = _best_fit_kernel(narrow[placement], seq_len)
    del narrow
    offsets = np.zeros(len(count) + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    members = np.empty(int(offsets[-1]), index_type)
    _group_members(assign, placement, offsets, members)
    return Packing(seq_len, offsets, members, tokens, too_long.astype(np.int64))


def collate_pack(sequences: Sequence[TrainingSequence], seq_len: int, pad_id: int,
                 num_codebooks: int) -> PackedBatch:
    """Concatenate the sequences of one pack and pad the tail to `seq_len` -> PackedBatch [1, seq_len, (C)].

    cu_seqlens = [0, L0, L0+L1, ..., total]; the padding tail is not a segment, except in an all-padding
    pack (cu_seqlens [0, seq_len]: attention needs one). Tail rows: input_ids = pad_id, the rest `TAIL_FILL`.
    """
    total = sum(len(s) for s in sequences)
    if total > seq_len:
        raise ValueError(f"pack holds {total} tokens > seq_len={seq_len} "
                         f"(samples {[s.sample_id for s in sequences]})")
    for s in sequences:
        _check_sequence(s, num_codebooks)
    tail = seq_len - total

    def cat(name: str, dtype: torch.dtype, columns: int = 0) -> torch.Tensor:
        shape = (tail, columns) if columns else (tail,)
        parts = [getattr(s, name).to(dtype) for s in sequences]
        parts.append(torch.full(shape, pad_id if name == "input_ids" else TAIL_FILL[name], dtype=dtype))
        return torch.cat(parts)

    bounds = [0]
    for s in sequences:
        bounds.append(bounds[-1] + len(s))
    if not sequences:
        bounds.append(seq_len)
    token_valid = torch.zeros(seq_len, dtype=torch.bool)
    token_valid[:total] = True
    return PackedBatch(
        input_ids=cat("input_ids", torch.int64, num_codebooks).unsqueeze(0),
        labels=cat("labels", torch.int64, num_codebooks).unsqueeze(0),
        type_ids=cat("type_ids", torch.int64),
        turn_ids=cat("turn_ids", torch.int64),
        block_ids=cat("block_ids", torch.int64),
        position_ids=cat("position_ids", torch.int64),
        is_clean=cat("is_clean", torch.bool),
        token_valid=token_valid,
        noise_t=cat("noise_t", torch.float32),
        answer_mask=cat("answer_mask", torch.bool),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        seg_bounds=tuple(bounds),
    )


def _check_sequence(s: TrainingSequence, num_codebooks: int) -> None:
    n = len(s)
    if n <= 0:
        raise ValueError(f"sample {s.sample_id} has an empty training sequence")
    for name in ("input_ids", "labels"):
        t = getattr(s, name)
        if t.dim() != 2 or tuple(t.shape) != (n, num_codebooks):
            raise ValueError(f"sample {s.sample_id}: {name} has shape {list(t.shape)}, "
                             f"expected [{n}, {num_codebooks}]")
    for name in ("type_ids", "turn_ids", "block_ids", "position_ids", "is_clean", "noise_t", "answer_mask"):
        t = getattr(s, name)
        if tuple(t.shape) != (n,):
            raise ValueError(f"sample {s.sample_id}: {name} has shape {list(t.shape)}, expected [{n}]")
