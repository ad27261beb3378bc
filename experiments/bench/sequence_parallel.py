"""Sequence parallelism on 2 gloo ranks: per-rank peak memory and step time at sp = 1 and sp = 2, and the
all-to-all volume of the attention exchange per layer.

    python experiments/bench/sequence_parallel.py [--seq-len 16384] [--sp 1 2] [--policy full]
        [--warm-steps 0] [--timeout-s 3600]

Model: the memory benchmark's small configuration (`step_memory.SMALL_CONFIG`: hidden 256,
4 layers, 8 / 2 heads of 32 dims, 64 experts top-8, the official vocabulary and heads), fp32, attention
backend segmented, gradient checkpointing `--policy`. Both ranks get the same pack of S tokens of the built-in
world (`world_pack`): at sp = 1 each rank runs the whole pack (two data-parallel ranks), at sp = 2 each rank
runs S/2 of its rows and the two meet in attention. Parameters are FSDP2-sharded over both ranks (ep = 1).
One step = zero_grad, forward, `LuminaObjective`, backward, SGD step, measured as in `experiments/bench/memory.py`
(`measure_step`: the rise of each rank's peak RSS over its RSS after setup, cold first step; with
--warm-steps N the time is the median of N more steps). Each rank runs one thread; both ranks share this
machine's cores, so the step time is the slower rank's and tokens/s counts the tokens the step trained
(S per data-parallel rank).

The all-to-all volume is counted on one extra forward before the measured step: bytes each rank sends to
the other ranks through `UlyssesAttention` (q/k/v in, the output back), per layer; the backward sends the
same again, and `full` checkpointing repeats the forward's exchange in its recompute.

Measured 2026-12-01 on this 2-core CPU (S = 16,384, policy full, one cold step; two other agents' jobs
shared the machine, so the times are rough):

| sp | rows / rank | rise MiB / rank | step s | tokens / s | all-to-all MiB / layer / rank (fwd) |
|---|---|---|---|---|---|
| 1 | 16,384 | 2,123 | 250.6 | 131 | 0 |
| 2 | 8,192 | 1,549 | 75.2 | 218 | 10.00 |

Per rank, sp = 2 needs 0.73x the memory of sp = 1: the activations halve, while the unsharded FSDP units, the
heads' weights and gradients and the fused loss's 256 MiB logits buffer do not (the same bench at S = 1,024
rises by about 1,170 MiB at either sp). The measured 10.00 MiB per layer equals the formula above:
8,192 x (8 + 2 x 2) x 32 x 4 B / 2 in plus 8,192 x 8 x 32 x 4 B / 2 out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def rank_main(args: argparse.Namespace) -> None:
    """One rank: build, shard, count one forward's all-to-all bytes, measure one step; print a JSON line."""
    import torch
    import torch.distributed as dist
    from step_memory import SMALL_CONFIG, measure_step, pack_rows, policy_fields, world_pack

    from lumina.distributed import ParallelConfig, build_meshes, parallelize
    from lumina.distributed.parallel_plan import OFFICIAL_PLAN
    from lumina.distributed.sequence_parallel import SequenceShard, UlyssesAttention
    from lumina.model import LuminaConfig, LuminaModel
    from lumina.model.activation_checkpointing import apply_checkpointing
    from lumina.objective import LuminaObjective

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, (sp,) = dist.get_rank(), args.sp
    fields = {**SMALL_CONFIG, **policy_fields(args.policy), "attn_backend": "segmented"}
    pack = world_pack(args.seq_len, 8)
    config = LuminaConfig.official(**fields)
    with torch.device("meta"):
        model = LuminaModel(config)
    apply_checkpointing(model, config.gradient_checkpointing)
    torch.manual_seed(0)
    parallel = ParallelConfig(sp=sp)
    meshes = build_meshes(parallel.resolve(dist.get_world_size()), "cpu")
    parallelize(model, meshes, parallel, OFFICIAL_PLAN, torch.device("cpu"))
    group = meshes.sequence.get_group("sp") if meshes.sequence is not None else None
    batch = SequenceShard(rank % sp, sp, config.pad_token_id).local(pack) if sp > 1 else pack
    objective = LuminaObjective(sequence_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    sent = [0]
    exchange = UlyssesAttention._exchange

    def counted(self, x):  # noqa: ANN001, ANN202 - counts what leaves this rank, then exchanges
        sent[0] += x.numel() * x.element_size() * (self.sp - 1) // self.sp
        return exchange(self, x)

    UlyssesAttention._exchange = counted
    with torch.no_grad():
        model(batch)
    UlyssesAttention._exchange = exchange

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        objective(model(batch), batch).loss.backward()
        optimizer.step()

    measured = measure_step(step, args.warm_steps)
    record = {"rank": rank, "sp": sp, "rows": batch.seq_len, "rise_bytes": measured.rise_bytes,
              "step_s": measured.step_s, "warm_step_s": measured.warm_step_s,
              "a2a_bytes_per_layer": sent[0] / config.num_hidden_layers, "pack": pack_rows(pack)}
    print("RESULT " + json.dumps(record), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(sp: int, args: argparse.Namespace) -> list[dict]:
    """Two ranks of this file (--rank-child) at `sp`; their RESULT records."""
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                   OMP_NUM_THREADS="1")
        command = [sys.executable, str(HERE), "--rank-child", "--sp", str(sp), "--seq-len", str(args.seq_len),
                   "--policy", args.policy, "--warm-steps", str(args.warm_steps)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + args.timeout_s
    records = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"sp={sp}: a rank failed (exit {proc.returncode}):\n{err[-3000:]}")
        records.append(json.loads(lines[-1][len("RESULT "):]))
    return records


def table(results: dict[int, list[dict]], seq_len: int) -> str:
    rows = ["| sp | rows / rank | rise MiB / rank (max) | step s | tokens / s | all-to-all MiB / layer / rank (fwd) |",
            "|---|---|---|---|---|---|"]
    for sp, ranks in results.items():
        rise = max(r["rise_bytes"] for r in ranks) / 2**20
        step = max(statistics.median(r["warm_step_s"]) if r["warm_step_s"] else r["step_s"] for r in ranks)
        tokens = seq_len * (2 // sp)
        a2a = max(r["a2a_bytes_per_layer"] for r in ranks) / 2**20
        rows.append(f"| {sp} | {ranks[0]['rows']} | {rise:,.0f} | {step:.1f} | {tokens / step:,.0f} | {a2a:.2f} |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--sp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--policy", default="full", choices=("none", "full", "selective"))
    parser.add_argument("--warm-steps", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rank_child:
        rank_main(args)
        return
    results = {}
    for sp in args.sp:
        results[sp] = launch(sp, args)
        print(f"sp={sp}: " + json.dumps([{k: r[k] for k in ("rank", "rows", "rise_bytes", "step_s",
                                                            "a2a_bytes_per_layer")} for r in results[sp]]),
              flush=True)
    print(f"S = {args.seq_len}, policy {args.policy}, pack rows {results[args.sp[0]][0]['pack']}")
    print(table(results, args.seq_len))


if __name__ == "__main__":
    main()
