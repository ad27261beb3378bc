"""The pure-Python best fit that lumina shipped before the compiled packer, kept as a readable reference:
`lumina.data.packing.best_fit` must give exactly its packs (same members, same order) for the same lengths,
rng and order. Returns (packs as lists of sample indices, their tokens, skipped indices)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lumina.data.packing import PackOrder


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
                       ) -> tuple[list[list[int]], list[int], list[int]]:
    """Best fit of valid lengths (>= 1; those longer than seq_len are skipped) in the placement order `rng`
    draws ("shuffled"), or longest first with ties in that order ("longest_first")."""
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    too_long = np.flatnonzero(lens > seq_len)
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
