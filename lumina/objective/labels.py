"""Targets at the model output's supervised rows, and the noise check inverse_t weighting needs there.

The labels themselves are shape-normalised by `PackedBatch` and value-checked once, where they enter the step
(`lumina.model.supervision.check_labels`, called by the model's forward that chose the rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Targets:
    """text [Nt] int64 (targets at the output's text rows), image [Ni, C] int64 (at its image rows)."""

    text: torch.Tensor
    image: torch.Tensor


def gather_targets(labels: torch.Tensor, text_rows: torch.Tensor, image_rows: torch.Tensor) -> Targets:
    """labels [B, S, C]; rows are flat indices b*S+s chosen by the model (never re-selected)."""
    flat = labels.reshape(-1, labels.shape[-1])
    return Targets(text=flat[text_rows.long(), 0], image=flat[image_rows.long()])


def check_inverse_t_rows(text_rows: torch.Tensor, noise_t: torch.Tensor, answer_mask: torch.Tensor) -> None:
    """inverse_t weighting divides by t: every supervised text row (text_rows [Nt] flat) needs noise_t > 0
    and answer_mask true (noise_t, answer_mask [B, S]). Raises ValueError naming the first bad row; one sync."""
    rows = text_rows.long()
    t, answer = noise_t.reshape(-1)[rows], answer_mask.reshape(-1)[rows]
    bad_t, bad_answer = ~(t > 0), ~answer
    failed = torch.stack([bad_t.any(), bad_answer.any()]).tolist()
    if failed[0]:
        i = int(bad_t.nonzero()[0, 0])
        raise ValueError(f"noise_t row {int(rows[i])} = {float(t[i])}: inverse_t weighting needs noise_t > 0 at "
                         f"every supervised text row")
    if failed[1]:
        raise ValueError(f"answer_mask row {int(rows[bad_answer.nonzero()[0, 0]])} is false: inverse_t weighting "
                         f"needs answer_mask true at every supervised text row")
