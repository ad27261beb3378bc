"""One training step of the memory benchmark's small configuration: step time, analytic FLOPs, and MFU against
a GEMM probe measured in the same process; variants side by side (A/B), and where the time goes.

    python experiments/bench/train_step.py [--seq-len 2048] [--steps 5] [--threads 1]
        [--variants today adamw_loop moe_loop compiled] [--shape small|learns_cpu] [--check-flops]
        [--profile]

Model: `LuminaConfig.official(**SMALL_CONFIG)` (`step_memory.py`: hidden 256, 4 layers, 64
experts top-8, the official 157,184-word head and 8 x 4,096-code heads, the channel head at its defaults; fp32,
attn_backend segmented). Batch: `world_pack(S)`, the pack `experiments/bench/memory.py` measures (text-QA and
text-to-image samples of the built-in world in a random order). One step = zero_grad, forward,
`LuminaObjective`, backward, AdamW step (`lumina.training.optim.build_optimizer`, what `lumina-train` runs).

Each variant gets its own model (same seed, same weights) and optimizer; the steps run round-robin (one warm-up
step each, then --steps rounds), so machine load hits all alike; medians are reported. FLOPs per step:
`lumina.model.flops.training_flops` (matrix products, forward + backward, what FlopCounterMode counts;
--check-flops runs FlopCounterMode once to show it). The peak: `gemm_probe_tflops` (best of 5 products of
1024 x 1024 fp32 matrices with the same threads), measured before every round; MFU = FLOPs / median step time
/ median probe.

Variants: `today` (the defaults), `compiled` (`today` under `apply_compile`, what model.compile=true runs; its
first step compiles, reported as the first step's time minus the median; the inductor cache is
TORCHINDUCTOR_CACHE_DIR's), `adamw_loop` (AdamW as torch picks it on CPU without `fused`: the per-tensor
loop lumina used before), `moe_loop` (moe_backend loop instead of grouped_mm), `chunk_64mib` (fused head losses
in 64 MiB logit chunks instead of 256).

Measured 2026-12-01 on this 2-core CPU (shared with other jobs), S = 2048: 27 text and 916 image rows
supervised; 428.98 GFLOP per step (FlopCounterMode: 429.08), of which the channel head 74.1%, the 8 codebook
heads 10.8%, the experts 6.8%, the dense FFN 2.3%, attention projections 1.9%, the text head 1.5%.

    1 thread, --variants today adamw_loop moe_loop --check-flops, probe 96.3 GFLOP/s (82.6-97.4):
    | variant    | step s | TFLOP/s | MFU   | vs today |
    | today      | 7.43   | 0.0577  | 59.9% | 1.000    |
    | adamw_loop | 8.48   | 0.0506  | 52.5% | 1.142    |
    | moe_loop   | 6.98   | 0.0614  | 63.8% | 0.940    |
    2 threads, --variants today adamw_loop, probe 148.6 GFLOP/s (100.1-181.5):
    | today      | 5.03   | 0.0852  | 57.3% | 1.000    |
    | adamw_loop | 6.11   | 0.0702  | 47.2% | 1.214    |

`--shape learns_cpu`: the model and task mix of conf/experiment/learns_cpu.yaml instead. Each round also
records the process CPU time of every step (less hit by other jobs than wall time). compiled vs today, S =
2048, on a host loaded with 3-4 other jobs (experiments/compile.md): small, 1 thread: wall 0.969, CPU time
0.964, compile 528 s cold / 63 s warm cache (a quieter host: 0.981 / 0.971, MFU 74.8% -> 76.2%, 12.6 s warm);
learns_cpu, 1 thread: wall 0.971, CPU time 0.965.

`adamw_loop` is the step before AdamW went fused on CPU (`OptimConfig.fused` None now picks torch's fused
kernel where it runs): the optimizer step over 128 M parameters (the 157,184-word embedding and head are 80 M of
them) took 0.56 s at 1 thread, fused 0.10 s. What limits the rest (torch.profiler, 1 thread): the channel head
runs its GEMMs ([7,328 x 256] by [256 x 1,536] and the like) at about 88% of the probe, but as a whole at 67%
(4.7 s for 319 GFLOP): GELU, LayerNorm, the adaLN modulation products and SDPA over 7,328 sequences of 8
positions (0.36 s per step for 0.3% of the FLOPs; a hand-written softmax(QK^T)V is no faster) are memory-bound;
the experts' per-expert GEMMs are small (256 rows on average); the heads' fp32 weight gradients (40 M values
for the text head) and the dense gradient of the 157,184-row embedding are written in full every step.
`moe_loop` (one mm per expert) was 6% faster than grouped_mm here; experiments/bench/moe.py found the two within
3% of each other, so the default stays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from step_memory import SMALL_CONFIG, world_pack  # noqa: E402

from lumina.model import LuminaConfig, LuminaModel  # noqa: E402
from lumina.model.compile import apply_compile  # noqa: E402
from lumina.model.flops import forward_flops, pack_attention_pairs, training_flops  # noqa: E402
from lumina.model.supervision import PackRows  # noqa: E402
from lumina.objective import LuminaObjective  # noqa: E402
from lumina.training.optim import OptimConfig, build_optimizer  # noqa: E402
from lumina.training.throughput import gemm_probe_tflops  # noqa: E402

VARIANTS: dict[str, tuple[dict, dict]] = {  # name -> (LuminaConfig fields, OptimConfig fields)
    "today": ({}, {}),
    "compiled": ({}, {}),  # `today` with lumina.model.compile.apply_compile (what model.compile=true runs)
    "adamw_loop": ({}, {"fused": False}),
    "moe_loop": ({"moe_backend": "loop"}, {}),
    "chunk_64mib": ({"loss_chunk_rows": 64 * 2**20 // (4 * 157184)}, {}),
}


def make_step(config: LuminaConfig, optim_fields: dict, batch, compiled: bool = False) -> Callable[[], None]:  # noqa: ANN001
    torch.manual_seed(0)
    model = LuminaModel(config)
    if compiled:
        apply_compile(model)
    objective = LuminaObjective()
    optimizer = build_optimizer(model, OptimConfig(**optim_fields))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        objective(model(batch), batch).loss.backward()
        optimizer.step()
    return step


GEMMS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm")


def kind(op: str) -> str:
    """A profiler op name -> its group in `--profile`'s summary."""
    if op in GEMMS:
        return "matrix products"
    if "scaled_dot_product" in op:
        return "attention"
    if "CompiledFxGraph" in op or op.startswith("cpp_fused") or op.startswith("## "):
        return "compiled kernels"
    if "adam" in op.lower() or op.startswith("Optimizer"):
        return "optimizer"
    return "other"


def counted_flops(config: LuminaConfig, batch) -> int:  # noqa: ANN001
    """FlopCounterMode's count of one forward + objective + backward (with the ops its registry lacks)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "model"))
    from test_flops import CPU_OPS
    from torch.utils.flop_counter import FlopCounterMode

    model = LuminaModel(config)
    counter = FlopCounterMode(display=False, custom_mapping=CPU_OPS)
    with counter:
        LuminaObjective()(model(batch), batch).loss.backward()
    return counter.get_total_flops()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shape", default="small", choices=("small", "learns_cpu"),
                        help="small: SMALL_CONFIG; learns_cpu: conf/experiment/learns_cpu.yaml's model and pack")
    parser.add_argument("--variants", nargs="+", default=["today", "adamw_loop"], choices=sorted(VARIANTS))
    parser.add_argument("--check-flops", action="store_true", help="also count one step with FlopCounterMode")
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of one step of each")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.shape == "learns_cpu":  # the tiny preset with conf/experiment/learns_cpu.yaml's model and task mix
        experiment = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/experiment/learns_cpu.yaml")
        fields = {**OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/model/tiny.yaml").config,
                  **experiment.model.config}
        base = LuminaConfig.tiny(**OmegaConf.to_container(OmegaConf.create(fields)))
        batch = world_pack(args.seq_len, base.num_codebooks,
                           tasks=OmegaConf.to_container(experiment.data.sources[0].options.mix))
    else:
        batch = world_pack(args.seq_len, SMALL_CONFIG.get("num_codebooks", 8))
        base = LuminaConfig.official(**SMALL_CONFIG, attn_backend="segmented")
    rows, pairs = PackRows.of(batch), pack_attention_pairs(batch, "segmented")
    flops = training_flops(base, rows, pairs)
    parts = forward_flops(base, rows, pairs)
    share = ", ".join(f"{name} {value / sum(parts.values()):.1%}" for name, value in
                      sorted(parts.items(), key=lambda item: -item[1])[:5])
    print(f"S={args.seq_len}: {rows.text} text / {rows.image} image rows supervised; "
          f"{flops / 1e9:.2f} GFLOP per step ({share}); {args.threads} thread(s)", flush=True)
    if args.check_flops:
        print(f"FlopCounterMode: {counted_flops(base, batch) / 1e9:.2f} GFLOP", flush=True)

    steps = {name: make_step(base.replace(**VARIANTS[name][0]), VARIANTS[name][1], batch, name == "compiled")
             for name in args.variants}
    warm_up = {}
    for name, step in steps.items():
        start = time.perf_counter()
        step()  # warm-up (the compiled variant compiles here)
        warm_up[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu_times: dict[str, list[float]] = {name: [] for name in steps}  # process CPU time: less hit by other jobs
    probes = []
    for _ in range(args.steps):
        probes.append(gemm_probe_tflops(torch.float32))
        for name, step in steps.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            step()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - cpu_start)
    probe = statistics.median(probes)
    print(f"GEMM probe: {probe * 1e3:.1f} GFLOP/s (median of {len(probes)}; range "
          f"{min(probes) * 1e3:.1f}-{max(probes) * 1e3:.1f})")
    first = args.variants[0]
    print(f"| variant | step s (median) | TFLOP/s | MFU | vs {first} | CPU s (median) | CPU vs {first} | first step s |"
          "\n|---|---|---|---|---|---|---|---|")
    for name, ts in times.items():
        median, cpu = statistics.median(ts), statistics.median(cpu_times[name])
        rate = flops / median / 1e12
        print(f"| {name} | {median:.2f} | {rate:.4f} | {rate / probe:.1%} | "
              f"{median / statistics.median(times[first]):.3f} | {cpu:.2f} | "
              f"{cpu / statistics.median(cpu_times[first]):.3f} | {warm_up[name]:.1f} |")
    if "compiled" in steps:
        from torch._dynamo.utils import counters

        print(f"compiled: {counters['stats']['unique_graphs']} graphs; compile time (first step - median) "
              f"{warm_up['compiled'] - statistics.median(times['compiled']):.1f} s with the inductor cache at "
              f"{os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'its default (/tmp/torchinductor_$USER)')}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            events = prof.key_averages()
            print(f"--- {name}\n" + events.table(sort_by="self_cpu_time_total", row_limit=20))
            total = sum(e.self_cpu_time_total for e in events)
            shares = {group: sum(e.self_cpu_time_total for e in events if kind(e.key) == group) / total
                      for group in ("matrix products", "attention", "compiled kernels", "optimizer", "other")}
            print(f"{name}: self time {total / 1e6:.2f} s: " + ", ".join(f"{g} {v:.1%}" for g, v in shares.items()))


if __name__ == "__main__":
    main()
