"""`LuminaOutput`: what `LuminaModel.forward` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lumina.model.heads import HeadLoss, LuminaHeads


@dataclass
class LuminaOutput:
    """Row indices are flat (b * S + s). The heads' inputs are kept, not their logits: `text_logits` and
    `image_logits` are computed on demand (generation, evaluation), and training takes `text_loss` /
    `image_loss`, which fuse each head with its cross-entropy in row chunks.

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

    @property
    def text_logits(self) -> torch.Tensor:
        """[Nt, V], computed on each access."""
        return self.heads.text_logits(self.text_states)

    @property
    def image_logits(self) -> torch.Tensor:
        """[Ni, C, K], computed on each access."""
        return self.heads.image_logits(self.image_states)

    def text_loss(self, targets: torch.Tensor, row_weight: torch.Tensor) -> HeadLoss:
        """targets [Nt], row_weight [Nt] -> sum(row_weight * CE), CE [Nt], argmax [Nt]."""
        return self.heads.text_loss(self.text_states, targets, row_weight)

    def image_loss(self, targets: torch.Tensor, row_weight: torch.Tensor) -> HeadLoss:
        """targets [Ni, C], row_weight [Ni] -> sum over cells and codebooks, CE [Ni, C], argmax [Ni, C]."""
        return self.heads.image_loss(self.image_states, targets, row_weight)
