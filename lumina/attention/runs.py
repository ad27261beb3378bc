"""Runs of adjacent segments of equal lengths: the unit of one batched SDPA call in the segmented backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """`count` adjacent segments of `q_length` query rows from `q_start` and `k_length` key rows from
    `k_start` (the same when queries are the keys)."""

    q_start: int
    q_length: int
    k_start: int
    k_length: int
    count: int

    @property
    def q_size(self) -> int:
        return self.q_length * self.count

    @property
    def k_size(self) -> int:
        return self.k_length * self.count


def group_runs(q_bounds: tuple[int, ...], k_bounds: tuple[int, ...] | None = None) -> tuple[Run, ...]:
    """Host bounds of the queries' and the keys' segments (k_bounds None: the queries are the keys) -> runs,
    in position order (host only, no device work)."""
    k_bounds = q_bounds if k_bounds is None else k_bounds
    runs: list[Run] = []
    for qa, qb, ka, kb in zip(q_bounds, q_bounds[1:], k_bounds, k_bounds[1:], strict=False):
        lq, lk = qb - qa, kb - ka
        last = runs[-1] if runs else None
        if last is not None and (last.q_length, last.k_length) == (lq, lk):
            runs[-1] = Run(last.q_start, lq, last.k_start, lk, last.count + 1)
        else:
            runs.append(Run(qa, lq, ka, lk, 1))
    return tuple(runs)
