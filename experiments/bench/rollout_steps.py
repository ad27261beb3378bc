"""One rl_world rollout (8 prompts x G 8, lumina's samplers, unguided, temperature 1) with the image sampler at
16 steps (the world evaluation's) against 12 and 8, on the same prompts and weights:

    OMP_NUM_THREADS=1 python experiments/bench/rollout_steps.py outputs/learns_cpu/hf --batches 3

Prints each variant's median seconds and its ratio to 16 steps. The rollout bounds an rl_world cycle
(experiments/rl_world.md), so this ratio is what `rollout.image_steps` buys.

Measured 2026-12-07 (seed-7 `learns_cpu` export, 1 thread, nothing beside it, 3 batches of rl_world's mix, t2i
0.3 / edit 0.65 / vqa 0.05): 16 steps 5.65 s, 12 steps 4.16 s (0.74x), 8 steps 2.94 s (0.52x).
"""

from __future__ import annotations

import argparse
import statistics

from rl_update import MIX
from timing import interleaved_times

from lumina.checkpoint import load_pretrained
from lumina.post_training.rollout import RolloutConfig, rollout
from lumina.world.rl_prompts import WorldPrompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    model = load_pretrained(args.checkpoint).train()
    data = WorldPrompts(8, num_items=2000, mix=MIX)
    data.setup()
    variants = {f"{steps} steps": RolloutConfig(group_size=8, prompts_per_step=8, image_steps=steps)
                for steps in (16, 12, 8)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(args.batches):
        prompts = data.prompts_for(index)
        fns = {name: (lambda c=config, p=prompts, i=index: rollout(model, p, c, data.tokens, i))
               for name, config in variants.items()}
        for name, ts in interleaved_times(fns, repeats=1, warmup=index == 0).items():
            times[name] += ts
    base = statistics.median(times["16 steps"])
    for name, ts in times.items():
        print(f"{name:>9}: {statistics.median(ts):6.2f} s  ({statistics.median(ts) / base:.2f}x of 16 steps)")


if __name__ == "__main__":
    main()
