"""`LuminaOutput`: what `LuminaModel.forward` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lumina.model.heads import LuminaHeads


@dataclass
class LuminaOutput:
    """Row indices are flat (b * S + s). The heads' inputs are kept, not their logits: `heads` turns them into
    logits on demand (`heads.text_logits(text_states)`, `heads.image_logits(image_states)`) or, in training,
    into the fused chunked losses (`heads.text_loss`, `heads.image_loss`).

    hidden               [B, S, H] final-normed backbone states
    text_states          [Nt, H] hidden at `text_rows` [Nt] int64
    image_states         [Ni, C, D] channel-head states at `image_rows` [Ni] int64 (teacher-forced; [0, C, D]
                         without labels, while image_rows still lists the type-4 query rows for samplers)
    heads                the model's text and codebook heads
    router_logits        per MoE layer, fp32 [B, S, E] (pre-sigmoid)
    router_topk_ids      per MoE layer, int64 [B, S, k]
    router_topk_weights  per MoE layer, fp32 [B, S, k]
    """

    hidden: torch.Tensor
    text_states: torch.Tensor
    text_rows: torch.Tensor
    image_states: torch.Tensor
    image_rows: torch.Tensor
    heads: LuminaHeads
    router_logits: list[torch.Tensor] = field(default_factory=list)
    router_topk_ids: list[torch.Tensor] = field(default_factory=list)
    router_topk_weights: list[torch.Tensor] = field(default_factory=list)
