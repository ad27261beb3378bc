"""Measured memory of one training step on CPU: the rise of the process's peak RSS over the RSS after setup.

    python experiments/bench/step_memory.py --seq-len 2048 [--policy none] [--config '{"vocab_size": 4096}']

builds a `LuminaConfig.official(...)` model (the memory benchmark's small configuration, with --config's
fields on top) and one pack of the built-in world's text-QA and text-to-image samples (`world_pack`), then
runs forward -> `LuminaObjective` -> backward -> SGD step under `measure_step`; it prints a JSON line with the
baseline before the step (for a watchdog) and one with the whole record after it.
`experiments/bench/memory.py --child` runs this file, and `tests/training/test_memory_estimate.py` checks
`estimate_step_memory` against it.

How a step is measured (`measure_step`): after setup the garbage collector runs, glibc returns its free heap
pages (`malloc_trim`) and the kernel's high-water mark is reset (`/proc/self/clear_refs` = 5); the baseline
is VmRSS then, the peak VmHWM after the step. Without a resettable mark (not Linux) the peak is
`ru_maxrss` and the rise only counts what exceeds the setup's own peak. Freed memory that glibc keeps
resident is part of the figure: it is what the machine has to hold.

Imports only the standard library at module level: the benchmark loads this file by path to measure an
older checkout of `lumina` (on PYTHONPATH) with the same code; everything it needs from `lumina` (config,
model, objective, data) exists in both.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
# The memory benchmark's small configuration: official vocabulary, heads and structure, small widths.
SMALL_CONFIG: dict[str, Any] = dict(
    hidden_size=256, num_hidden_layers=4, first_k_dense_replace=1, intermediate_size=1024,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32, rotary_dim=16,
    num_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4, moe_intermediate_size=128,
    num_shared_experts=1, torch_dtype="float32",
)
PACK_TASKS = {"t2i": 0.5, "text_qa": 0.5}
MEAN_SAMPLE_TOKENS = 40  # first guess of a world sample's laid-out tokens (t2i + text-QA: ~50 on average)


def _status_bytes(key: str) -> int | None:
    """A `kB` line of /proc/self/status (e.g. VmRSS, VmHWM) in bytes, None where there is none."""
    if not STATUS.is_file():
        return None
    for line in STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def max_rss_bytes() -> int:
    """ru_maxrss in bytes (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def resident_bytes() -> int:
    """This process's resident set now (VmRSS; ru_maxrss where /proc is missing)."""
    rss = _status_bytes("VmRSS")
    return rss if rss is not None else max_rss_bytes()


def peak_resident_bytes() -> int:
    """Peak resident set since the process started or the last `reset_peak` (VmHWM; else ru_maxrss)."""
    hwm = _status_bytes("VmHWM")
    return hwm if hwm is not None else max_rss_bytes()


def release_free_memory() -> None:
    """Collect garbage and hand glibc's free heap pages back to the kernel (no-op without glibc)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False where that is not possible."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@dataclass
class StepMeasurement:
    """baseline_bytes: RSS after setup; peak_bytes: peak RSS during the measured (first) step; step_s: its
    wall time; warm_step_s: wall times of the steps run after it; peak_reset: the peak mark was reset (else
    the rise is a lower bound, see the module docstring)."""

    baseline_bytes: int
    peak_bytes: int
    step_s: float
    warm_step_s: list[float] = field(default_factory=list)
    peak_reset: bool = True

    @property
    def rise_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)


def measure_step(step: Callable[[], object], warm_steps: int = 0,
                 on_baseline: Callable[[int], object] | None = None) -> StepMeasurement:
    """Run `step` once with its peak RSS rise measured, then `warm_steps` more times, timed only.
    `on_baseline(bytes)` hears the baseline before the step starts (e.g. a parent's memory watchdog)."""
    release_free_memory()
    peak_reset = reset_peak()
    baseline = resident_bytes() if peak_reset else max_rss_bytes()
    if on_baseline is not None:
        on_baseline(baseline)
    start = time.perf_counter()
    step()
    step_s = time.perf_counter() - start
    peak = peak_resident_bytes()
    warm = []
    for _ in range(warm_steps):
        start = time.perf_counter()
        step()
        warm.append(time.perf_counter() - start)
    return StepMeasurement(baseline, peak, step_s, warm, peak_reset)


def world_pack(seq_len: int, num_codebooks: int = 8, seed: int = 0, tasks: dict[str, float] | None = None):
    """One pack of `seq_len` tokens from the built-in world (text-QA and text-to-image samples by default),
    laid out (block-diffusion metadata, epoch-0 noise and CFG dropout) and collated by the data pipeline: the
    samples of a world with at least 1.25 x seq_len tokens, in a random order, each taken while it fits (so
    the pack keeps the world's task mix; best-fit-decreasing would fill it with the longest, text-to-image). Image codes come from a
    world image tokenizer with `num_codebooks` codebooks (64 codes each; fitted once and cached)."""
    import numpy as np

    from lumina.data.noise import NoiseConfig
    from lumina.data.packing import collate_pack
    from lumina.data.sources import LayoutSource
    from lumina.tokenizers.rvq_quantizer import RVQSettings
    from lumina.world import build_world

    if seq_len < 1:
        raise ValueError(f"world_pack: seq_len={seq_len} must be >= 1")
    num_samples = seq_len // MEAN_SAMPLE_TOKENS + 16
    while True:
        world = build_world("train", num_samples, seed, tasks or PACK_TASKS,
                            rvq=RVQSettings(num_codebooks=num_codebooks))
        source = LayoutSource(world.dataset, NoiseConfig(), seed)
        lengths = source.lengths(0)
        if sum(lengths) >= 1.25 * seq_len:
            break
        num_samples = int(num_samples * 1.5 * seq_len / max(sum(lengths), 1)) + 16
    chosen, used = [], 0  # samples in a random order, each taken while it fits: the task mix of the world
    for i in np.random.default_rng(seed).permutation(len(lengths)).tolist():
        if used + lengths[i] <= seq_len:
            chosen.append(i)
            used += lengths[i]
    if not chosen:
        raise ValueError(f"world_pack: no world sample fits seq_len={seq_len}")
    sequences = [source.sequence(i, 0) for i in chosen]
    return collate_pack(sequences, seq_len, world.tokens.pad, num_codebooks)


def pack_rows(batch: Any) -> dict[str, int] | None:
    """`PackRows.of(batch)` as a dict (what the estimate needs), None with a lumina that predates it."""
    try:
        from lumina.model.supervision import PackRows
    except ImportError:
        return None
    return asdict(PackRows.of(batch))


def training_step(config_fields: dict[str, Any], batch: Any, seed: int = 0) -> Callable[[], None]:
    """A LuminaModel of `LuminaConfig.official(**config_fields)` (fp32, built here, its checkpointing policy
    applied) and a closure running one step on `batch`: zero_grad (set to None), forward, `LuminaObjective`,
    backward, SGD step (no state)."""
    import torch

    from lumina.model import LuminaConfig, LuminaModel
    from lumina.objective import LuminaObjective

    torch.manual_seed(seed)
    model = LuminaModel(LuminaConfig.official(**config_fields))
    try:  # today's lumina applies the policy from outside the model; older ones in its constructor
        from lumina.model.activation_checkpointing import apply_checkpointing
    except ImportError:
        pass
    else:
        apply_checkpointing(model, model.config.gradient_checkpointing)
    objective = LuminaObjective()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        objective(model(batch), batch).loss.backward()
        optimizer.step()
    return step


def announce_baseline(baseline_bytes: int) -> None:
    """Print the baseline as a JSON line before the step runs (the benchmark's watchdog reads it)."""
    print(json.dumps({"baseline_bytes": baseline_bytes}), flush=True)


def run_child(seq_len: int, config_fields: dict[str, Any], warm_steps: int = 0, threads: int = 0,
              tasks: dict[str, float] | None = None) -> dict[str, Any]:
    """Build the model (SMALL_CONFIG with `config_fields` on top) and a `world_pack` of `tasks`, measure one
    step (`measure_step`) -> a JSON-ready record."""
    import torch

    import lumina

    if threads:
        torch.set_num_threads(threads)
    fields = {**SMALL_CONFIG, **config_fields}
    batch = world_pack(seq_len, fields.get("num_codebooks", 8), tasks=tasks)
    step = training_step(fields, batch)
    measured = measure_step(step, warm_steps, announce_baseline)
    return {**asdict(measured), "rise_bytes": measured.rise_bytes, "rows": pack_rows(batch), "config": fields,
            "lumina": str(Path(lumina.__file__).resolve().parent), "threads": torch.get_num_threads()}


def policy_fields(policy: str) -> dict[str, Any]:
    """LuminaConfig fields of a checkpointing policy; `none` sets nothing (the default of every lumina
    version, including those whose `gradient_checkpointing` was a bool)."""
    return {} if policy == "none" else {"gradient_checkpointing": policy}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--policy", default="none", help="gradient_checkpointing: none | full | selective")
    parser.add_argument("--attn-backend", default="segmented")
    parser.add_argument("--config", default="{}", help="JSON object of LuminaConfig fields over SMALL_CONFIG")
    parser.add_argument("--tasks", default=json.dumps(PACK_TASKS), help="JSON task mix of the world pack")
    parser.add_argument("--warm-steps", type=int, default=0, help="steps timed after the measured one")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    fields = {"attn_backend": args.attn_backend, **policy_fields(args.policy), **json.loads(args.config)}
    record = run_child(args.seq_len, fields, args.warm_steps, args.threads, json.loads(args.tasks))
    print(json.dumps({"seq_len": args.seq_len, "policy": args.policy, "pid": os.getpid(), **record}), flush=True)


if __name__ == "__main__":
    main()
