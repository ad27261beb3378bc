"""pass@k of a checkpoint's text-to-image and edit answers on the built-in world (issue 45: the SFT start's
headroom), with the world evaluation's own items and samplers (unguided, 16 steps, temperature 1):

    OMP_NUM_THREADS=1 python experiments/rl_pass_at_k.py outputs/learns_cpu/hf --split test --items 96 --k 8

Draws k images per item (sampler seeds seed, seed + 1, ...; the first is `lumina-generate task=eval`'s), checks
each with the world's checker and prints per task: exact (all four attributes right) of each draw, its mean
over the draws with the standard deviation across draws, and pass@k (share of items with at least one exact
draw among the k).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lumina.checkpoint import load_pretrained
from lumina.generation.image import generate_images
from lumina.generation.sampling_config import ImageSamplingConfig
from lumina.world.checker import classify_image
from lumina.world.evaluation import ATTRIBUTES, IMAGE_TASKS, WorldEvalConfig, build_eval_set


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test")
    parser.add_argument("--items", type=int, default=96)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=ImageSamplingConfig.seed)
    args = parser.parse_args()
    model = load_pretrained(args.checkpoint).eval()
    eval_set = build_eval_set(WorldEvalConfig(split=args.split, num_items=args.items))
    for task in IMAGE_TASKS:
        items, prompts = eval_set.items[task], eval_set.prompts[task]
        exact = torch.zeros(args.k, len(items))
        start = time.perf_counter()
        for d in range(args.k):
            config = ImageSamplingConfig(steps=16, temperature=1.0, cfg_scale=0.0, seed=args.seed + d)
            with torch.no_grad():
                answers = generate_images(model, prompts, eval_set.tokens, config)
            for i, (answer, item) in enumerate(zip(answers, items, strict=True)):
                found = classify_image(eval_set.image_tokenizer.decode(answer.codes, *answer.grid)[0])
                exact[d, i] = float(found is not None and all(found[a] == getattr(item.target, a) for a in ATTRIBUTES))
            print(f"{task:4s} draw {d} (seed {args.seed + d}) exact {float(exact[d].mean()):.3f}", flush=True)
        per_draw = exact.mean(1).tolist()
        spread = statistics.stdev(per_draw) if args.k > 1 else 0.0
        print(f"{task:4s} exact mean over {args.k} draws {statistics.mean(per_draw):.3f} (std across draws "
              f"{spread:.3f})  pass@{args.k} {float(exact.amax(0).mean()):.3f}  "
              f"({len(items)} items, {time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
