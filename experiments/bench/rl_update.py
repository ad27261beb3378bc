"""One GRPO inner epoch (the policy's estimates + backward) scoring only the groups GRPO keeps, against scoring
every completion (what the post-training mode did before `LossTerm.reads`), on the same rollouts:

    OMP_NUM_THREADS=1 python experiments/bench/rl_update.py outputs/learns_cpu/hf --batches 5

Each batch is one rl_world rollout (8 prompts x G 8, the prompt mix of conf/experiment/rl_world.yaml, exact rewards,
`remask` for images, `coupled` for text); both variants then run the same inner epoch on it, interleaved, without an
optimizer step, so they score the same views with the same weights. Prints per batch the share of groups with equal
rewards, the seconds of the cycle's first step (rollout, rewards, the old policy's estimates on both epochs' views;
each variant once, not interleaved) and the two inner-epoch times, then the median ratio.

Measured 2026-12-07 (seed-7 `learns_cpu` export, 1 thread, two rl_world runs beside it, 3 batches, mix t2i 0.3 /
edit 0.65 / vqa 0.05): equal-reward groups 0.38 / 0.12 / 0.00, ratio 0.62 / 0.85 / 0.94 (median 0.85); the first
step (rollout) 14-15 s against an inner epoch of 1.1-1.9 s, so the rollout bounds an rl_world cycle
(experiments/rl_world.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from timing import interleaved_times

from lumina.checkpoint import load_pretrained
from lumina.post_training.losses.grpo import GRPO
from lumina.post_training.mode import PostTraining, PostTrainingConfig
from lumina.post_training.prompts import PromptBatch
from lumina.post_training.rewards import Rewards
from lumina.post_training.rollout import RolloutConfig
from lumina.world.rewards import ExactMatch, WorldCheck
from lumina.world.rl_prompts import WorldPrompts

# rl_world's prompt mix, read from its experiment config rather than restated
MIX = dict(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/experiment/rl_world.yaml").rollout.prompts.mix)


class GRPOScoringAll(GRPO):
    """GRPO reading every completion: the baseline."""

    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(rewards), dtype=torch.bool)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    args = parser.parse_args()
    model = load_pretrained(args.checkpoint).train()
    data = WorldPrompts(args.prompts, num_items=2000, mix=MIX)
    data.setup()
    rewards = Rewards({"t2i": WorldCheck(exact=True), "edit": WorldCheck(exact=True), "vqa": ExactMatch()})
    config = PostTrainingConfig(estimators={"text": "coupled", "image": "remask"}, inner_epochs=2)
    ratios = []
    for index in range(args.batches):
        batch = PromptBatch(index, data.prompts_for(index), data.tokens, data.tasks)
        modes = {"kept groups": PostTraining(config, RolloutConfig(group_size=args.group), rewards),
                 "every completion": PostTraining(config, RolloutConfig(group_size=args.group), rewards)}
        modes["every completion"].term = GRPOScoringAll()
        first = {}
        for name, mode in modes.items():  # the rollout (cycle 0) and the old policy's pass
            start = time.perf_counter()
            _, metrics = mode.step(model, None, batch, step=0)
            first[name] = time.perf_counter() - start
        share = float(metrics["zero_variance_share"])

        def epoch(mode: PostTraining, batch: PromptBatch = batch) -> None:  # inner epoch 1: estimates + backward
            loss, _ = mode.step(model, None, batch, step=1)
            loss.backward()
            model.zero_grad(set_to_none=True)

        times = interleaved_times({name: (lambda m=mode: epoch(m)) for name, mode in modes.items()}, repeats=3,
                                  alternate=True)
        kept, every = statistics.median(times["kept groups"]), statistics.median(times["every completion"])
        ratios.append(kept / every)
        print(f"batch {index}: equal-reward groups {share:.2f}  first step {first['kept groups']:6.2f} / {first['every completion']:6.2f} s  inner "
              f"epoch: kept groups {kept:6.2f} s, every completion {every:6.2f} s, ratio {kept / every:.2f}",
              flush=True)
    print(f"median time ratio (kept groups / every completion) over {args.batches} batches: "
          f"{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
