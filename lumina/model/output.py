"""`LuminaOutput`: what `LuminaModel.forward` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LuminaOutput:
    """Row indices are flat (b * S + s).

    hidden               [B, S, H] final-normed backbone states
    text_logits          [Nt, V] at `text_rows` [Nt] int64
    image_logits         [Ni, C, K] at `image_rows` [Ni] int64 (teacher-forced; [0, C, K] without labels,
                         while image_rows still lists the type-4 query rows for samplers)
    router_logits        per MoE layer, fp32 [B, S, E] (pre-sigmoid)
    router_topk_ids      per MoE layer, int64 [B, S, k]
    router_topk_weights  per MoE layer, fp32 [B, S, k]
    """

    hidden: torch.Tensor
    text_logits: torch.Tensor
    text_rows: torch.Tensor
    image_logits: torch.Tensor
    image_rows: torch.Tensor
    router_logits: list[torch.Tensor] = field(default_factory=list)
    router_topk_ids: list[torch.Tensor] = field(default_factory=list)
    router_topk_weights: list[torch.Tensor] = field(default_factory=list)
