"""Objective + heads: `LuminaObjective` on the fused, chunked head losses against autograd through full logits.

Both sides start from the same head inputs (text states [Nt, H], channel-head states [Ni, C, H]) and heads
(the official 157,184-word text head and 8 x 4096 codebook heads at H = 256, the small configuration of the
memory benchmark). Baseline: logits = head(states) for every head, F.cross_entropy on the fp32 logits with the
objective's weighting, backward (what the objective did before the fused losses). Candidate: the objective
(validation, global-token normalisation, balance counts) with the fused losses, backward.
ratio = candidate time / baseline time (medians of round-robin repeats, one thread).
Run: python experiments/bench/objective_overhead.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timing import interleaved_medians
from torch import nn

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaOutput
from lumina.model.heads import Head, LuminaHeads
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

S, H, C, V, K, E, TOPK, LAYERS = 4096, 256, 8, 157184, 4096, 64, 8, 3


def setup(num_text: int, num_image: int) -> tuple[LuminaOutput, PackedBatch]:
    gen = torch.Generator().manual_seed(0)
    types = torch.ones(S, dtype=torch.long)
    types[:num_text] = 3
    types[num_text:num_text + num_image] = 4
    labels = torch.full((S, C), -100)
    labels[:num_text, 0] = torch.randint(0, V, (num_text,), generator=gen)
    labels[num_text:num_text + num_image] = torch.randint(0, K, (num_image, C), generator=gen)
    batch = PackedBatch(input_ids=torch.zeros(1, S, C, dtype=torch.long), type_ids=types[None],
                        turn_ids=torch.zeros(1, S, dtype=torch.long), block_ids=torch.zeros(1, S, dtype=torch.long),
                        position_ids=torch.arange(S)[None], is_clean=torch.zeros(1, S, dtype=torch.bool),
                        token_valid=torch.ones(1, S, dtype=torch.bool), cu_seqlens=[0, S], labels=labels[None])
    heads = LuminaHeads(Head(H, V, std=0.02), nn.ModuleList(Head(H, K, std=0.02) for _ in range(C)))
    output = LuminaOutput(
        hidden=torch.empty(1, S, 0), heads=heads,
        text_states=torch.randn(num_text, H, generator=gen).requires_grad_(), text_rows=torch.arange(num_text),
        image_states=torch.randn(num_image, C, H, generator=gen).requires_grad_(),
        image_rows=torch.arange(num_text, num_text + num_image),
        router_logits=[torch.randn(1, S, E, generator=gen).requires_grad_() for _ in range(LAYERS)],
        router_topk_ids=[torch.randint(0, E, (1, S, TOPK), generator=gen) for _ in range(LAYERS)])
    return output, batch


def main() -> None:
    torch.set_num_threads(1)
    num_text, num_image = 512, 1024
    output, batch = setup(num_text, num_image)
    text_targets = batch.labels[0, :num_text, 0]
    image_targets = batch.labels[0, num_text:num_text + num_image]

    def full_logits() -> None:
        text_logits = output.heads.text_logits(output.text_states).float()
        image_logits = output.heads.image_logits(output.image_states).float()
        text = F.cross_entropy(text_logits, text_targets, reduction="sum") / num_text
        image = F.cross_entropy(image_logits.reshape(-1, K), image_targets.reshape(-1),
                                reduction="sum")
        (text + image / (num_image * C)).backward()

    configs = {
        "objective, validate, no balance": ObjectiveConfig(balance=BalanceConfig(bias_update=False)),
        "objective, no validation, no balance": ObjectiveConfig(validate=False,
                                                                balance=BalanceConfig(bias_update=False)),
    }
    fns = {"full logits": full_logits}
    for label, cfg in configs.items():
        objective = LuminaObjective(cfg)
        fns[label] = lambda o=objective: o(output, batch).loss.backward()
    params = [output.text_states, output.image_states, *output.heads.text.parameters(),
              *output.heads.image.parameters()]

    def reset(fn):
        def run() -> None:
            for p in params:
                p.grad = None
            fn()
        return run

    medians = interleaved_medians({k: reset(f) for k, f in fns.items()}, repeats=5)
    base = medians.pop("full logits")
    print(f"Nt={num_text} V={V} Ni={num_image} C={C} K={K} H={H}; full-logits median {base * 1e3:.1f} ms")
    for label, seconds in medians.items():
        print(f"{label:42s} {seconds * 1e3:8.1f} ms  ratio {seconds / base:.2f}")


if __name__ == "__main__":
    main()
