"""Confidence-threshold text decoding (`TextSamplingConfig.threshold`) beside fixed steps, each with and without
the key/value cache, on a trained checkpoint (random weights are never confident, so a threshold would change
nothing there): the built-in world's text tasks (`lumina.world.evaluation.TEXT_TASKS`, val split) with the world
evaluation's text settings (one 16-token block, 8 steps, temperature 0, 16 prompts per forward).

    OMP_NUM_THREADS=1 python experiments/bench/threshold.py /tmp/rlrun/learns_cpu_1234/hf [--items 64]
        [--threshold 0.9] [--repeats 3]

Prints per mode the median seconds [min-max] of interleaved rounds, the backbone forwards of one run, and
how many answers (before EOA) equal the fixed-step ones and, with the threshold, whether the cached runs
decode every token (EOA and after included) as the uncached ones. Figures: experiments/kv_cache.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_times  # noqa: E402

from lumina.generation.assets import load_model  # noqa: E402
from lumina.generation.text import generate_text  # noqa: E402
from lumina.world.evaluation import TEXT_TASKS, WorldEvalConfig, build_eval_set  # noqa: E402


def counted_forwards(model, run) -> tuple[list, int]:  # noqa: ANN001
    """(run()'s answers, the backbone forwards it made)."""
    real, count = model.backbone, [0]

    def backbone(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        count[0] += 1
        return real(*args, **kwargs)

    model.backbone = backbone
    try:
        return run(), count[0]
    finally:
        del model.backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.checkpoint, device="cpu", dtype="float32")
    world = WorldEvalConfig(num_items=args.items)
    eval_set = build_eval_set(world)
    prompts = [p for task in TEXT_TASKS for p in eval_set.prompts[task]]
    configs = {f"{name} cache={cache}": dataclasses.replace(world.text, threshold=threshold, cache=cache)
               for name, threshold in (("fixed", None), (f"threshold {args.threshold}", args.threshold))
               for cache in (False, True)}
    runs = {key: (lambda c=config: generate_text(model, prompts, eval_set.tokens, c))
            for key, config in configs.items()}
    answers, forwards = {}, {}
    for key, run in runs.items():
        out, forwards[key] = counted_forwards(model, run)
        answers[key] = [(a.ids, a.raw) for a in out]
    times = interleaved_times(runs, args.repeats, warmup=False, alternate=True)
    fixed = answers["fixed cache=False"]
    print(f"{args.checkpoint}: {len(prompts)} prompts ({', '.join(TEXT_TASKS)}, {args.items} each), "
          f"{world.text.gen_length} tokens in {world.text.steps} steps, 1 thread; {args.repeats} interleaved rounds")
    base = statistics.median(times["fixed cache=False"])
    for key in runs:
        same = sum(a[0] == b[0] for a, b in zip(answers[key], fixed, strict=True))
        t = times[key]
        print(f"{key:28s} {statistics.median(t):6.2f} s [{min(t):.2f}-{max(t):.2f}]  "
              f"{base / statistics.median(t):4.2f}x fixed-no-cache  {forwards[key]:4d} forwards  "
              f"answers equal to fixed: {same}/{len(prompts)}")
    name = f"threshold {args.threshold}"
    cached, uncached = answers[f"{name} cache=True"], answers[f"{name} cache=False"]
    print(f"threshold: every decoded token with the cache equal to those without: "
          f"{sum(a == b for a, b in zip(cached, uncached, strict=True))}/{len(prompts)}")


if __name__ == "__main__":
    main()
