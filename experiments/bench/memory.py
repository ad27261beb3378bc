"""Peak memory of one training step by sequence length and checkpointing policy, and the step time of today's
path against the previous commit's.

    python experiments/bench/memory.py [--seq-lens 4096 16384 65536 131072] [--policies none full selective]
        [--budget-gib 20] [--baseline-ref 3b24575] [--compare-seq-len 2048] [--compare-repeats 3]
        [--skip-compare] [--warm-steps 0] [--threads 0] [--timeout-s 0]

Model: `LuminaConfig.official(...)` at the small configuration (`step_memory.SMALL_CONFIG`):
hidden 256, 4 layers (layer 0 dense, intermediate 1024), 8 / 2 attention heads of 32 dims (rotary 16),
64 experts top-8 in 8 groups / 4 chosen, moe_intermediate 128, one shared expert, with the official
vocabulary and heads (157,184 words, 8 codebooks x 4,096 codes, the channel head at its defaults); fp32,
attn_backend segmented (what auto resolves to on CPU). Batch: one pack of S tokens of the built-in world's
text-QA and text-to-image samples, laid out with block-diffusion metadata and packed by the data pipeline
(`world_pack`; its image tokenizer has 8 codebooks of 64 codes). One step = zero_grad, forward,
`LuminaObjective`, backward, SGD step.

Each measurement is a fresh child process (`--child`, which runs `experiments/bench/step_memory.py`): it
builds the model and the pack, then measures the rise of peak RSS (VmHWM, reset after setup) over the RSS
after setup during the first, cold step (`measure_step`), and its wall time; with --warm-steps N the step
time reported is the median of N more steps. "est." is `estimate_step_memory(...).step_rise` for the same
config and the pack's rows (what `lumina-train estimate_memory=true` computes). A child that the kernel
kills (SIGKILL: out of memory) or that raises MemoryError counts as not fitting, and so does one whose rise
passes --budget-gib: the parent watches each child's RSS and kills it there. The longest S whose step rose
by less than the budget is printed per policy.

The time comparison checks out --baseline-ref into a temporary `git worktree` and runs the same child
script with PYTHONPATH pointing at it, so the child imports that commit's `lumina`; today's children import
this working tree. Both run policy none (old lumina: gradient_checkpointing was a bool, default False) and
attn_backend segmented (the old default was sdpa_dense), --compare-repeats children each, interleaved; the
step time is one warm step after the measured one; medians and their ratio are printed.

Reference figures (the issue, S = 16384, this configuration, segmented): the official modeling code adds
11,058 MiB, lumina before this work 13,403 MiB. Goals: S = 16384 at most 5,530 MiB with the default or one
documented policy; S = 131072 under 20 GiB; step time at S = 2048 no worse than the previous commit.

Measured 2026-12-01 on this 2-core CPU (two benchmark children at a time, one thread each; cold first step;
the pack: samples of the world in a random order, 1.4% supervised text rows, 41% supervised image rows):

| S | policy | rise MiB | MiB / 1k tokens | est. MiB | step s | text / image rows |
|---|---|---|---|---|---|---|
| 4096 | none | 3900 | 952 | 3564 | 25.6 | 56 / 1661 |
| 4096 | full | 883 | 216 | 1239 | 20.5 | 56 / 1661 |
| 4096 | selective | 1045 | 255 | 1314 | 20.3 | 56 / 1661 |
| 16384 | full | 2047 | 125 | 2302 | 75.3 | 215 / 6811 |
| 16384 | selective | 2256 | 138 | 2601 | 69.1 | 215 / 6811 |
| 65536 | full | 6317 | 96 | 6273 | 499.3 | 880 / 26425 |
| 131072 | full | 9956 | 76 | 11417 | 883.4 | 1759 / 53291 |

    longest S that trains under 20 GiB (measured): 131072, policy full

    step time at S = 2048, policy none, segmented (medians of 3 interleaved children each):
           today: warm step 8.83 s, cold step 12.86 s, rise 2328 MiB
         3b24575: warm step 10.15 s, cold step 11.83 s, rise 2682 MiB
      today / 3b24575: 0.870 (warm step; goal <= 1)

Under none the channel head dominates (about 1.6 MiB per supervised image row: 8 positions x 6 blocks x
32 x 256 fp32 values); full and selective checkpoint it 128 rows at a time. What grows with S under full:
the layer inputs, the head inputs and their gradients, the teacher-forcing code embeddings and one layer's
recompute. A first pack taken by best-fit-decreasing (all text-to-image, 4 text rows at S = 131072) gave
full: 946 MiB at 4096, 2126 at 16384, 12180 at 131072 (819 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STEP_MEMORY = Path(__file__).resolve().parent / "step_memory.py"
MIB = 2**20
GIB = 2**30
OOM_MARKERS = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "out of memory")


@dataclass
class ChildResult:
    """One child: its final JSON record, or why it gave none (`failure`), and whether that means 'does not
    fit' (killed by the kernel or the watchdog, out of memory)."""

    seq_len: int
    policy: str
    label: str
    record: dict[str, Any] | None = None
    failure: str | None = None
    out_of_memory: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rise_mib(self) -> float:
        return self.record["rise_bytes"] / MIB

    @property
    def step_s(self) -> float:
        """The median warm step when there were any, else the measured (cold) one."""
        warm = self.record["warm_step_s"]
        return statistics.median(warm) if warm else self.record["step_s"]


def load_step_memory():  # noqa: ANN201 - a module
    """experiments/bench/step_memory.py of this checkout, loaded by path (so `lumina` itself may come from
    another checkout on PYTHONPATH)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lumina_step_memory", STEP_MEMORY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def resident_of(pid: int) -> int | None:
    """VmRSS of process `pid` in bytes (None once it is gone or without /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _read_lines(stream, sink: list[str]) -> None:  # noqa: ANN001 - a text stream
    for line in stream:
        sink.append(line)


def run_child(seq_len: int, policy: str, label: str, pythonpath: Path, args: argparse.Namespace,
              warm_steps: int) -> ChildResult:
    """Run one `--child` with `pythonpath` first on PYTHONPATH; kill it when its RSS rises by more than the
    budget over the baseline it announces (or after --timeout-s)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--seq-len", str(seq_len), "--policy",
               policy, "--warm-steps", str(warm_steps), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(pythonpath),
                                                                     os.environ.get("PYTHONPATH")]))}
    result = ChildResult(seq_len, policy, label)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = [], []
    readers = [threading.Thread(target=_read_lines, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_read_lines, args=(proc.stderr, err), daemon=True)]
    for reader in readers:
        reader.start()
    start, limit = time.monotonic(), args.budget_gib * GIB
    while proc.poll() is None:
        baseline = next((json.loads(line)["baseline_bytes"] for line in out
                         if line.startswith('{"baseline_bytes"')), None)
        rss = resident_of(proc.pid)
        if baseline is not None and rss is not None and rss - baseline > limit:
            proc.kill()
            result.failure = f"rise passed {args.budget_gib:g} GiB (killed at {(rss - baseline) / GIB:.1f} GiB)"
            result.out_of_memory = True
        elif args.timeout_s and time.monotonic() - start > args.timeout_s:
            proc.kill()
            result.failure = f"timed out after {args.timeout_s} s"
        time.sleep(0.1)
    for reader in readers:
        reader.join()
    records = [json.loads(line) for line in out if line.startswith("{")]
    result.events = records
    if result.failure is None:
        result.failure, result.out_of_memory = _exit_failure(proc.returncode, "".join(err))
    if result.failure is None:
        result.record = records[-1]
    return result


def _exit_failure(returncode: int, stderr: str) -> tuple[str | None, bool]:
    """(why a child failed or None, whether that was memory) from its exit status and stderr."""
    if returncode == 0:
        return None, False
    if returncode == -signal.SIGKILL:
        return "killed by SIGKILL (the kernel's OOM killer?)", True
    if any(marker in stderr for marker in OOM_MARKERS):
        return "out of memory: " + _last_line(stderr), True
    return f"exit {returncode}: {_last_line(stderr)}", False


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def estimate_mib(result: ChildResult) -> float:
    """`estimate_step_memory(...).step_rise` (SGD) for the child's config and pack rows, in MiB."""
    from lumina.model import LuminaConfig
    from lumina.model.supervision import PackRows
    from lumina.training.memory_estimate import estimate_step_memory

    record = result.record
    config = LuminaConfig.official(**record["config"])
    estimate = estimate_step_memory(config, result.seq_len, result.policy, PackRows(**record["rows"]),
                                    optimizer="sgd")
    return estimate.step_rise / MIB


def memory_table(results: list[ChildResult], budget_gib: float, warm_steps: int) -> str:
    timing = f"median of {warm_steps} warm steps" if warm_steps else "the measured, cold step"
    lines = [f"| S | policy | rise MiB | MiB / 1k tokens | est. MiB | step s ({timing}) | text / image rows |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.record is None:
            lines.append(f"| {r.seq_len} | {r.policy} | did not finish: {r.failure} | | | | |")
            continue
        rows = r.record["rows"]
        lines.append(f"| {r.seq_len} | {r.policy} | {r.rise_mib:.0f} | {r.rise_mib * 1000 / r.seq_len:.0f} | "
                     f"{estimate_mib(r):.0f} | {r.step_s:.2f} | {rows['text']} / {rows['image']} |")
    lines.append("")
    lines += longest_fitting(results, budget_gib)
    return "\n".join(lines)


def longest_fitting(results: list[ChildResult], budget_gib: float) -> list[str]:
    """Per policy, the longest measured S whose step rose by less than the budget."""
    lines = []
    for policy in dict.fromkeys(r.policy for r in results):
        fitting = [r.seq_len for r in results if r.policy == policy and r.record is not None
                   and r.record["rise_bytes"] < budget_gib * GIB]
        tried = sorted(r.seq_len for r in results if r.policy == policy)
        best = max(fitting) if fitting else "none"
        lines.append(f"longest S that trains under {budget_gib:g} GiB, policy {policy}: {best} (measured {tried})")
    return lines


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A temporary detached `git worktree` of `ref` (removed again on exit)."""
    with tempfile.TemporaryDirectory(prefix="lumina_prev_") as parent:
        path = Path(parent) / "lumina_prev"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), ref], check=True,
                       capture_output=True, text=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                           capture_output=True, text=True)


def compare_step_time(args: argparse.Namespace) -> str:
    """Interleaved children of today's path and --baseline-ref at --compare-seq-len, policy none."""
    results: dict[str, list[ChildResult]] = {"today": [], args.baseline_ref: []}
    with worktree(args.baseline_ref) as old:
        roots = {"today": REPO, args.baseline_ref: old}
        for _ in range(args.compare_repeats):
            for label, root in roots.items():
                result = run_child(args.compare_seq_len, "none", label, root, args, warm_steps=1)
                if result.record is None:
                    raise RuntimeError(f"{label} child at S={args.compare_seq_len} failed: {result.failure}")
                if Path(result.record["lumina"]) != (root / "lumina").resolve():
                    raise RuntimeError(f"{label} child imported {result.record['lumina']}, not {root / 'lumina'}")
                results[label].append(result)
    warm = {label: statistics.median(r.step_s for r in rs) for label, rs in results.items()}
    cold = {label: statistics.median(r.record["step_s"] for r in rs) for label, rs in results.items()}
    rise = {label: statistics.median(r.rise_mib for r in rs) for label, rs in results.items()}
    lines = [f"step time at S = {args.compare_seq_len}, policy none, segmented "
             f"(medians of {args.compare_repeats} interleaved children each):"]
    for label in results:
        lines.append(f"  {label:>10}: warm step {warm[label]:.2f} s, cold step {cold[label]:.2f} s, "
                     f"rise {rise[label]:.0f} MiB")
    today, old_label = warm["today"], args.baseline_ref
    lines.append(f"  today / {old_label}: {today / warm[old_label]:.3f} (warm step; goal <= 1)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--child", action="store_true", help="run one measurement (step_memory.py)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    parser.add_argument("--policies", nargs="+", default=["none", "full", "selective"],
                        choices=["none", "full", "selective"])
    parser.add_argument("--budget-gib", type=float, default=20.0)
    parser.add_argument("--baseline-ref", default="3b24575")
    parser.add_argument("--compare-seq-len", type=int, default=2048)
    parser.add_argument("--compare-repeats", type=int, default=3)
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--warm-steps", type=int, default=0, help="timed steps after the measured one")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the children (0: default)")
    parser.add_argument("--timeout-s", type=float, default=0, help="kill a child after this long (0: never)")
    args, rest = parser.parse_known_args(argv)
    if args.child:
        args.child_argv = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    for name in ("budget_gib", "compare_seq_len", "compare_repeats"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be > 0")
    if any(s < 1 for s in args.seq_lens):
        parser.error(f"--seq-lens {args.seq_lens}: every S must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_argv = [*args.child_argv, "--warm-steps", str(args.warm_steps), "--threads", str(args.threads)]
        load_step_memory().main(child_argv)
        return
    results = []
    for seq_len in args.seq_lens:
        for policy in args.policies:
            result = run_child(seq_len, policy, "today", REPO, args, args.warm_steps)
            print(f"S={seq_len} {policy}: " + (f"rise {result.rise_mib:.0f} MiB, step {result.step_s:.2f} s"
                                             if result.record else f"failed: {result.failure}"), flush=True)
            results.append(result)
    print(memory_table(results, args.budget_gib, args.warm_steps), flush=True)
    if not args.skip_compare:
        print(compare_step_time(args), flush=True)


if __name__ == "__main__":
    main()
