"""The likelihood estimators' spread on the same rollouts (issue 45's closing note), on a trained checkpoint:

    OMP_NUM_THREADS=1 python experiments/rl_estimators.py outputs/learns_cpu/hf --prompts 8 --group 8 --draws 16

Rolls out G samples per prompt of the world's train split (t2i and vqa, the rl_world rollout settings), then
scores every completion `draws` times with each estimator (fresh masks each time) and prints, per estimator,
the mean estimate per scored token, the across-draw standard deviation of a completion's estimate (mean over
completions) and the seconds per scoring pass.
"""

from __future__ import annotations

import argparse
import time

import torch

from lumina.checkpoint import load_pretrained
from lumina.post_training.estimators import build_estimator
from lumina.post_training.rollout import RolloutConfig, rollout
from lumina.post_training.scoring import score_views
from lumina.world.rl_prompts import WorldPrompts

ESTIMATORS = {"text": ["one_step", "coupled", "blockwise", "trace"], "image": ["trajectory", "remask"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--draws", type=int, default=16)
    args = parser.parse_args()
    model = load_pretrained(args.checkpoint).eval()
    config = RolloutConfig(group_size=args.group)
    for task, modality in (("vqa", "text"), ("t2i", "image")):
        data = WorldPrompts(args.prompts, num_items=200, mix={task: 1.0})
        data.setup()
        completions = rollout(model, data.prompts_for(0), config, data.tokens, step=0)
        tokens = torch.tensor([float(c.num_tokens) for c in completions])
        for name in ESTIMATORS[modality]:
            estimator = build_estimator(name, "estimator")
            draws, start = [], time.perf_counter()
            with torch.no_grad():
                for d in range(args.draws):
                    views = estimator.plan(completions, torch.Generator().manual_seed(d))
                    draws.append(score_views(model, completions, views, data.tokens, config.temperature))
            seconds = (time.perf_counter() - start) / args.draws
            values = torch.stack(draws)  # [draws, N]
            print(f"{task:4s} {name:10s} mean/token {float((values / tokens).mean()):8.4f}  "
                  f"std of an estimate {float(values.std(0).mean()):7.4f}  per token "
                  f"{float((values / tokens).std(0).mean()):7.4f}  {seconds:6.2f} s/pass", flush=True)


if __name__ == "__main__":
    main()
