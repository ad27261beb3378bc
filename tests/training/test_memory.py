"""`train/peak_mem_gib`: the process's peak memory (peak RSS on CPU), logged every optimizer step."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from train_helpers import compose_train, quiet, small_data

from lumina.training.memory import peak_memory_gib
from lumina.training.run import run

STATM = Path("/proc/self/statm")
needs_proc = pytest.mark.skipif(not STATM.is_file(), reason="reads the current RSS from /proc/self/statm")


def current_rss_gib() -> float:
    """This process's resident set size now (independent of ru_maxrss, which peak_memory_gib reads)."""
    return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


@needs_proc
def test_cpu_peak_covers_a_fresh_allocation() -> None:
    before = current_rss_gib()
    block = torch.ones(2**26)  # 256 MiB of written float32 pages on top of the current RSS
    peak = peak_memory_gib(torch.device("cpu"))
    # 64 MiB slack: the kernel folds per-thread RSS counts into the peak lazily, and other pages may be freed
    assert peak >= before + 192 / 1024, (peak, before)
    assert block[-1] == 1


def test_every_step_logs_a_non_decreasing_peak_at_least_the_peak_before_the_fit(tmp_path: Path) -> None:
    """Like with like: the process's peak before the fit and the logged peaks are the same counter (the
    kernel updates it lazily, so the current RSS may run ahead of it for a while)."""
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), *small_data(), "logger=csv", "trainer.max_steps=3",
                         "trainer.limit_val_batches=0", "callbacks.checkpoint=null", "callbacks.hf_export=null"])
    peak_before = peak_memory_gib(torch.device("cpu"))
    run(cfg)
    rows = csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open())
    peaks = {int(r["step"]): float(r["train/peak_mem_gib"]) for r in rows if r.get("train/loss")}
    assert sorted(peaks) == [0, 1, 2]
    series = [peaks[step] for step in sorted(peaks)]
    assert all(a <= b for a, b in zip(series, series[1:], strict=False)), series
    assert series[0] >= peak_before > 0, (series, peak_before)
