"""Runs of adjacent segments of equal lengths: the unit of one batched SDPA call in the segmented backend."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Run:
    """`count` adjacent segments of `q_length` query rows (from `q_start`) and `k_length` keys (`k_start`)."""

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
    """Host segment bounds of the queries and the keys (None: the queries') -> runs, in position order."""
    k_bounds = q_bounds if k_bounds is None else k_bounds
    runs: list[Run] = []
    for qa, qb, ka, kb in zip(q_bounds, q_bounds[1:], k_bounds, k_bounds[1:], strict=False):
        lq, lk = qb - qa, kb - ka
        if runs and (runs[-1].q_length, runs[-1].k_length) == (lq, lk):
            runs[-1] = replace(runs[-1], count=runs[-1].count + 1)
        else:
            runs.append(Run(qa, lq, ka, lk, 1))
    return tuple(runs)
