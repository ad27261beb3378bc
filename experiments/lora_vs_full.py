"""LoRA against a full fine-tune on the CPU (issue 44's learning study; results in experiments/lora_vs_full.md).

    OMP_NUM_THREADS=1 python experiments/lora_vs_full.py OUT [--base-steps 400] [--steps 200] [--seeds 1 2]
        [--task vqa] [--rank 16] [--lora-lr 2e-3] [--full-lr 3e-4] [--modules-to-save NAME ...]
        [--full-freeze GLOB ...] [--runs full lora]

1. base: `lumina-train` of the tiny model on the built-in world without one of its tasks, `--task` (world
   seed 0, 2,000 samples, the default task mix less that task, seed 1234, `--base-steps` optimizer steps);
   its end-of-run export OUT/base/hf holds the weights and the world's tokenizers.
2. data: that task alone: world seed 7, 1,000 train and 128 held-out samples (the world's held-out scenes) as
   Parquet shards with the world's tokenizers, checked equal to the base checkpoint's tokenizer.json
   (OUT/data/{train,val}).
3. the base's held-out loss on that data (a one-step LoRA run at lr 1e-12, validated after its step);
4. for each seed: `experiment=finetune` (all weights) and `experiment=finetune_lora` from OUT/base/hf on that
   data, `--steps` steps each (LoRA: rank r, alpha 2r, on attention, dense MLP, shared and routed experts),
   the held-out loss every 50 steps (all held-out packs), the wall time of the run and its logged peak memory (train/peak_mem_gib: the process's peak RSS on CPU).
   `--modules-to-save`: base modules the LoRA runs train whole (adapter.modules_to_save); `--full-freeze`:
   model.freeze globs of the full runs (a diagnostic); `--runs`: which of the two to run.
Writes OUT/summary.json and prints a table. Each run is one process with one thread; runs go one at a time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

QUIET = ["logger=csv", "callbacks.conditioning=null", "callbacks.expert_usage=null", "callbacks.checkpoint=null",
         "callbacks.throughput=null", "callbacks.model_summary=null", "callbacks.progress_bar=null",
         "trainer.enable_progress_bar=false", "ckpt_path=null"]


def run(command: list[str], log: Path) -> float:
    """Run `command` (one thread), its output to `log`; the wall time in seconds; raise on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if code:
        raise SystemExit(f"{' '.join(command)} failed ({code}); see {log}")
    return time.perf_counter() - start


def metrics(run_dir: Path) -> list[dict[str, str]]:
    (path,) = sorted(run_dir.glob("csv/version_*/metrics.csv"))[-1:]
    with path.open() as f:
        return list(csv.DictReader(f))


def summarise(run_dir: Path, seconds: float) -> dict:
    rows = metrics(run_dir)
    val = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    peak = max(float(r["train/peak_mem_gib"]) for r in rows if r.get("train/peak_mem_gib"))
    step_times = [r for r in rows if r.get("train/loss")]
    return {"val_loss": val, "seconds": round(seconds, 1), "peak_mem_gib": round(peak, 3),
            "steps": len(step_times)}


def base_mix(task: str) -> str:
    """The world's default task mix without `task`, as a Hydra dict override."""
    from lumina.world.tasks import DEFAULT_TASK_MIX

    return "{" + ", ".join(f"{t}: {w}" for t, w in DEFAULT_TASK_MIX.items() if t != task) + "}"


def write_world(directory: Path, split: str, count: int, task: str) -> None:
    """`count` samples of `task` alone from the built-in world's `split` (world seed 7) as Parquet shards, with
    the world's tokenizers (those of the base checkpoint), as `lumina-data world` writes them."""
    from lumina.world.dataset import build_world

    world = build_world(split, count, seed=7, mix={task: 1.0})
    directory.mkdir(parents=True)
    world.dataset.save(directory, prefix=f"world-{task}-{split}")
    world.text_tokenizer.save(directory / "tokenizer.json")
    world.image_tokenizer.save(directory / "image_tokenizer.safetensors")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--base-steps", type=int, default=400)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--task", default="vqa", help="the world task the base never sees, then fine-tunes on")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=2e-3)
    parser.add_argument("--full-lr", type=float, default=3e-4)
    parser.add_argument("--modules-to-save", nargs="*", default=[], help="adapter.modules_to_save of the LoRA runs")
    parser.add_argument("--full-freeze", nargs="*", default=[], help="model.freeze globs of the full runs")
    parser.add_argument("--runs", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    train = [sys.executable, "-m", "lumina.train"]
    base = out / "base"
    if not (base / "hf" / "config.json").is_file():
        run([*train, f"hydra.run.dir={base}", f"trainer.max_steps={args.base_steps}", "trainer.val_check_interval=100",
             "data.sources.0.options.num_samples=2000", f"+data.sources.0.options.mix={base_mix(args.task)}", *QUIET],
            out / "base.log")
    data = out / "data"
    for split, count in (("train", 1000), ("val", 128)):
        if not (data / split).is_dir():
            write_world(data / split, split, count, args.task)
        if (data / split / "tokenizer.json").read_bytes() != (base / "hf" / "tokenizer.json").read_bytes():
            raise SystemExit(f"{data / split}: its tokenizer.json is not the base checkpoint's")
    lora = [f"adapter.rank={args.rank}", f"adapter.alpha={2 * args.rank}", f"optim.lr={args.lora_lr}",
            f"adapter.modules_to_save=[{','.join(args.modules_to_save)}]"]
    full = [f"optim.lr={args.full_lr}"] + ([f"model.freeze=[{','.join(args.full_freeze)}]"] if args.full_freeze else [])
    results: dict[str, dict] = {"settings": vars(args) | {"out": str(out)}}
    common = [f"model.init_from={base / 'hf'}", "data=parquet", f"data.sources.0.path={data / 'train'}",
              f"data.sources.0.options.val_path={data / 'val'}", "trainer.limit_val_batches=1.0",
              "optim.warmup_steps=10", "data.tokenizer=null", *QUIET]
    # the base's held-out loss: one LoRA step at lr 1e-12 (B stays ~1e-12, so this is the base), validated
    seconds = run([*train, "experiment=finetune_lora", *common, "trainer.max_steps=1", "trainer.val_check_interval=1",
                   "optim.lr=1e-12", f"hydra.run.dir={out / 'base_eval'}"], out / "base_eval.log")
    results["base"] = summarise(out / "base_eval", seconds)
    for seed in args.seeds:
        for mode, experiment, extra in (("full", "finetune", full), ("lora", "finetune_lora", lora)):
            if mode not in args.runs:
                continue
            name = f"{mode}_seed{seed}"
            run_dir = out / name
            seconds = run([*train, f"experiment={experiment}", *common, f"trainer.max_steps={args.steps}",
                           "trainer.val_check_interval=50", f"seed={seed}", f"hydra.run.dir={run_dir}", *extra],
                          out / f"{name}.log")
            results[name] = summarise(run_dir, seconds)
            (out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
            print(name, results[name], flush=True)


if __name__ == "__main__":
    main()
