"""Sampling the official channel head (`channel_ar`): position by position with a K/V cache over the codebook
positions (`MultiCodebookHead.sample`) against rerunning the blocks on the whole growing prefix for each
codebook (the head's sampling before the cache, rebuilt here on its public `run`), in one process, medians of
interleaved rounds, random weights, fp32, greedy picks.

    OMP_NUM_THREADS=1 python experiments/bench/channel_head.py [--rows 1024] [--repeats 5] [--width 512]

Rows are the masked image cells one sampler step scores (1,024: 16 pictures of 64 cells, as an rl_world
rollout batch); the head has the official shape (6 blocks, 8 codebooks, 4,096 codes) at width 512 (--width; the
official 2,048 takes minutes a round on a CPU). Positions computed: C = 8 against C (C + 1) / 2 = 36. Also
prints whether both give the same codes and the largest difference of their probabilities.

Measured 2026-12-07, 2-core CPU shared with two rl_world runs, 1 thread, --rows 512 --width 256, 3 rounds: cache
1.93 s, rerunning the prefix 6.85 s: 3.54x, the same codes on every row (experiments/kv_cache.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_times  # noqa: E402

from lumina.model.config import LuminaConfig  # noqa: E402
from lumina.model.image_heads import build_image_head  # noqa: E402
from lumina.model.image_heads.channel_ar import MultiCodebookHead  # noqa: E402


def greedy(logits: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = F.softmax(logits, dim=-1)
    tokens = probs.argmax(-1)
    return tokens, probs.gather(1, tokens[:, None])[:, 0]


@torch.no_grad()
def sample_rerunning_prefix(head: MultiCodebookHead, h: torch.Tensor, img_embeddings: nn.ModuleList,
                            lm_img_head: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: for codebook c, `run` on [cond, emb_0 .. emb_{c-1}] (c + 1 positions) and read the last."""
    cond = head.condition_proj(h)
    prefix = cond.new_zeros(h.shape[0], 0, cond.shape[-1])
    codes, probs = [], []
    for c in range(head.num_codebooks):
        tokens, p = greedy(lm_img_head[c](head.run(cond, prefix)[:, -1]), c)
        codes.append(tokens)
        probs.append(p)
        if c + 1 < head.num_codebooks:
            prefix = torch.cat([prefix, img_embeddings[c](tokens).unsqueeze(1)], dim=1)
    return torch.stack(codes, dim=1), torch.stack(probs, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LuminaConfig.official(hidden_size=args.width)
    head = build_image_head(config).eval()
    embeddings = nn.ModuleList(nn.Embedding(config.image_vocab_size, args.width) for _ in range(config.num_codebooks))
    heads = nn.ModuleList(nn.Linear(args.width, config.codebook_size, bias=False) for _ in range(config.num_codebooks))
    h = torch.randn(args.rows, args.width)
    cached = head.sample(h, greedy, embeddings, heads)
    rerun = sample_rerunning_prefix(head, h, embeddings, heads)
    same = float((cached[0] == rerun[0]).all(1).float().mean())
    diff = float((cached[1] - rerun[1]).abs().max())
    times = interleaved_times({"cache": lambda: head.sample(h, greedy, embeddings, heads),
                               "rerun prefix": lambda: sample_rerunning_prefix(head, h, embeddings, heads)},
                              args.repeats, alternate=True)
    cache, rerun_s = statistics.median(times["cache"]), statistics.median(times["rerun prefix"])
    print(f"rows {args.rows}, width {args.width}, {config.channel_depth} blocks, {config.num_codebooks} codebooks: "
          f"cache {cache:.3f} s [{min(times['cache']):.3f}-{max(times['cache']):.3f}], rerun prefix {rerun_s:.3f} s "
          f"[{min(times['rerun prefix']):.3f}-{max(times['rerun prefix']):.3f}]: {rerun_s / cache:.2f}x; "
          f"rows with the same codes {same:.3f}, largest probability difference {diff:.2e}")


if __name__ == "__main__":
    main()
