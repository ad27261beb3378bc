"""Objective overhead: `LuminaObjective` forward + backward against a bare cross-entropy baseline.

Baseline (same process, same logits): F.cross_entropy(text, reduction="sum") / Nt plus the mean over codebooks
of F.cross_entropy(image, reduction="sum") / Ni, backward. The objective adds label normalisation, the
one-sync validation, gathering at the output's rows, fp32 upcast, the balance loss and the expert counts.
ratio = objective time / baseline time (medians of round-robin repeats).
Run: python experiments/bench/objective_overhead.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timing import interleaved_medians

from lumina.data.batch import PackedBatch
from lumina.model import LuminaOutput
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

S, C, V, K, E, TOPK, LAYERS = 4096, 8, 16384, 4096, 64, 8, 4


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
    output = LuminaOutput(
        hidden=torch.empty(1, S, 0),
        text_logits=torch.randn(num_text, V, generator=gen).requires_grad_(),
        text_rows=torch.arange(num_text),
        image_logits=torch.randn(num_image, C, K, generator=gen).requires_grad_(),
        image_rows=torch.arange(num_text, num_text + num_image),
        router_logits=[torch.randn(1, S, E, generator=gen).requires_grad_() for _ in range(LAYERS)],
        router_topk_ids=[torch.randint(0, E, (1, S, TOPK), generator=gen) for _ in range(LAYERS)])
    return output, batch


def main() -> None:
    torch.set_num_threads(1)
    output, batch = setup(num_text=256, num_image=64)
    text_targets = batch.labels[0, :256, 0]
    image_targets = batch.labels[0, 256:320]

    def baseline() -> None:
        text = F.cross_entropy(output.text_logits, text_targets, reduction="sum") / 256
        image = F.cross_entropy(output.image_logits.reshape(-1, K), image_targets.reshape(-1), reduction="sum")
        (text + image / (64 * C)).backward()

    configs = {
        "objective, validate, no balance": ObjectiveConfig(balance=BalanceConfig(bias_update=False)),
        "objective, validate, aux + bias counts": ObjectiveConfig(balance=BalanceConfig(aux_coef=1e-3)),
        "objective, no validation, no balance": ObjectiveConfig(validate=False,
                                                                balance=BalanceConfig(bias_update=False)),
    }
    fns = {"baseline": baseline}
    for label, cfg in configs.items():
        objective = LuminaObjective(cfg)
        fns[label] = lambda o=objective: o(output, batch).loss.backward()
    medians = interleaved_medians(fns, repeats=9)
    base = medians.pop("baseline")
    print(f"S={S} Nt=256 V={V} Ni=64 C={C} K={K} E={E} layers={LAYERS}; baseline median {base * 1e3:.1f} ms")
    for label, seconds in medians.items():
        print(f"{label:42s} {seconds * 1e3:8.1f} ms  ratio {seconds / base:.2f}")


if __name__ == "__main__":
    main()
