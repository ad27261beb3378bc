"""Runs of adjacent equal-length segments: the unit of one batched SDPA call in the segmented backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """`count` adjacent segments of `length` tokens from position `start`."""

    start: int
    length: int
    count: int

    @property
    def size(self) -> int:
        return self.length * self.count


def group_runs(bounds: tuple[int, ...]) -> tuple[Run, ...]:
    """Host bounds -> runs, in position order (host only, no device work)."""
    runs: list[Run] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        length = end - start
        if runs and runs[-1].length == length:
            runs[-1] = Run(runs[-1].start, length, runs[-1].count + 1)
        else:
            runs.append(Run(start, length, 1))
    return tuple(runs)
