"""`LuminaOutput`: what `LuminaModel.forward` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lumina.model.heads import LuminaHeads


@dataclass
class LuminaOutput:
    """Row indices are flat (b * S + s). The heads' inputs are kept, not their logits: `heads` turns them into
    logits on demand (`heads.text_logits`, `heads.image_logits`) or, in training, into the fused chunked
    losses (`heads.text_loss`, `heads.image_loss`)."""

    hidden: torch.Tensor  # [B, S, H] final-normed backbone states
    text_states: torch.Tensor  # [Nt, H] hidden at text_rows
    text_rows: torch.Tensor  # [Nt] int64
    # [Ni, C, D] channel-head states at image_rows (teacher-forced; [0, C, D] without labels, while image_rows
    # still lists the type-4 query rows for samplers)
    image_states: torch.Tensor
    image_rows: torch.Tensor  # [Ni] int64
    heads: LuminaHeads  # the model's text and codebook heads
    router_logits: list[torch.Tensor] = field(default_factory=list)  # per MoE layer, fp32 [B, S, E] (pre-sigmoid)
    router_topk_ids: list[torch.Tensor] = field(default_factory=list)  # per MoE layer, int64 [B, S, k]
    router_topk_weights: list[torch.Tensor] = field(default_factory=list)  # per MoE layer, fp32 [B, S, k]
