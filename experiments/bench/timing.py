"""Timing helpers shared by the benchmarks: medians, measured round-robin so machine load hits all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: bool = True,
                      alternate: bool = False) -> dict[str, list[float]]:
    """Seconds of each fn in each of `repeats` rounds; each round runs every fn once (in reversed order every
    other round when `alternate`, so that neither always runs first)."""
    if warmup:
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats):
        order = list(fns.items())
        for name, fn in (order[::-1] if alternate and round_ % 2 else order):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, warmup: bool = True) -> dict[str, float]:
    """Median seconds of each fn over `repeats` rounds; each round runs every fn once."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, repeats, warmup).items()}


def median_seconds(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    return interleaved_medians({"fn": fn}, repeats, warmup)["fn"]


def synced(step: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """`step`, timed to the end of its device work (CUDA launches return before the kernels finish)."""
    if device.type != "cuda":
        return step

    def run() -> None:
        torch.cuda.synchronize(device)
        step()
        torch.cuda.synchronize(device)
    return run
