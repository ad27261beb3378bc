"""The pure-Python best fit that lumina shipped before the compiled packer, kept as a readable reference:
`lumina.data.packing.best_fit` must give exactly its packs (same members, same order) for the same lengths,
rng and order. Returns (packs as lists of sample indices, their tokens, skipped indices)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lumina.data.packing import OVERLONG_POLICIES, PACK_ORDERS, OverlongPolicy, PackOrder


class _FreeRoom:
    """Open packs indexed by free capacity 0..seq_len: a Fenwick tree of counts plus a stack per capacity."""

    def __init__(self, seq_len: int) -> None:
        self.size = seq_len + 1
        self.tree = [0] * (self.size + 1)
        self.stacks: dict[int, list[int]] = {}
        self.total = 0
        self.top_bit = 1 << (self.size.bit_length() - 1)

    def _add(self, room: int, delta: int) -> None:
        i = room + 1
        while i <= self.size:
            self.tree[i] += delta
            i += i & -i
        self.total += delta

    def push(self, room: int, pack: int) -> None:
        self.stacks.setdefault(room, []).append(pack)
        self._add(room, 1)

    def pop_smallest_at_least(self, need: int) -> tuple[int, int] | None:
        """Remove and return (room, pack) with the least room >= need, or None."""
        below, i = 0, need  # count of open packs with room < need
        while i > 0:
            below += self.tree[i]
            i -= i & -i
        if below == self.total:
            return None
        rank, pos, step = below + 1, 0, self.top_bit  # find the rank-th room in order (Fenwick descent)
        while step:
            nxt = pos + step
            if nxt <= self.size and self.tree[nxt] < rank:
                pos = nxt
                rank -= self.tree[nxt]
            step >>= 1
        room = pos  # tree index pos + 1 holds room pos
        pack = self.stacks[room].pop()
        self._add(room, -1)
        return room, pack


def reference_best_fit(lengths: Sequence[int], seq_len: int, rng: np.random.Generator, order: PackOrder = "shuffled",
             overlong: OverlongPolicy = "error", sample_id: Callable[[int], str] | None = None) -> tuple[list[list[int]], list[int], list[int]]:
    """Pack samples of the given laid-out lengths into packs of at most `seq_len` tokens.

    No sample is split. A sample longer than `seq_len` raises ValueError naming it (policy "error") or is
    left out and listed in `Packing.skipped` (policy "skip"). `rng` draws the placement order (`order`
    "shuffled") or orders samples of equal length ("longest_first").
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be positive")
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong={overlong!r}: expected one of {OVERLONG_POLICIES}")
    if order not in PACK_ORDERS:
        raise ValueError(f"order={order!r}: expected one of {PACK_ORDERS}")
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
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
        placement = placement[np.argsort(-lens[placement], kind="stable")]  # ties in the seeded order
    room = _FreeRoom(seq_len)
    members: list[list[int]] = []
    used: list[int] = []
    for i in placement.tolist():
        n = int(lens[i])
        if n > seq_len:
            continue
        found = room.pop_smallest_at_least(n)
        if found is None:
            pack, free = len(members), seq_len
            members.append([])
            used.append(0)
        else:
            free, pack = found
        members[pack].append(i)
        used[pack] += n
        if free - n > 0:
            room.push(free - n, pack)
    return members, used, sorted(too_long.tolist())
