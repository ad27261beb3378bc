"""The output heads (`lm_head`, `lm_img_head.{c}`) and `LuminaHeads`, the one way to use them: head inputs into
logits (generation, evaluation) or into chunked, fused cross-entropies (training). A head's loss goes through
the module's own call, so forward hooks (FSDP2's unshard, the participation tracker) see it as `head(x)`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lumina.model.layers import Linear, check_finite
from lumina.model.linear_ce import HeadLoss, linear_cross_entropy


class Head(Linear):
    """`head(x [N, H])` -> logits [N, V]; `head(x, targets [N], row_weight [N])` -> `linear_cross_entropy`'s
    `HeadLoss`. check_finite: raise FloatingPointError naming `stage` on inf/nan logits (or per-row CE)."""

    def __init__(self, in_features: int, out_features: int, std: float, chunk_rows: int = 0,
                 check_finite: bool = False, stage: str = "logits") -> None:
        super().__init__(in_features, out_features, std=std)
        self.chunk_rows = chunk_rows
        self.check_finite = check_finite
        self.stage = stage

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None,
                row_weight: torch.Tensor | None = None) -> torch.Tensor | HeadLoss:
        if targets is None:
            logits = super().forward(x)
            check_finite(self.check_finite, self.stage, logits)
            return logits
        if row_weight is None:
            raise ValueError(f"{self.stage} head: targets given without row_weight")
        loss = linear_cross_entropy(x, self.weight, self.bias, targets, row_weight, self.chunk_rows)
        check_finite(self.check_finite, self.stage, loss.per_row)
        return loss


@dataclass
class LuminaHeads:
    """The text head and the C codebook heads of one model."""

    text: nn.Module  # [N, H] -> [N, V]
    image: nn.ModuleList  # C heads, [N, D] -> [N, K]

    @property
    def vocab_size(self) -> int:
        return self.text.weight.shape[0]

    @property
    def codebook_size(self) -> int:
        return self.image[0].weight.shape[0]

    def text_logits(self, states: torch.Tensor) -> torch.Tensor:
        """states [N, H] -> [N, V]."""
        return self.text(states)

    def image_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Channel-head states [N, C, D] -> [N, C, K]: position j through head j."""
        return torch.stack([head(s) for head, s in zip(self.image, states.unbind(1), strict=True)], dim=1)

    def text_loss(self, states: torch.Tensor, targets: torch.Tensor, row_weight: torch.Tensor) -> HeadLoss:
        """states [N, H], targets [N], row_weight [N] -> total, CE [N], argmax [N]."""
        return self.text(states, targets, row_weight)

    def image_loss(self, states: torch.Tensor, targets: torch.Tensor, row_weight: torch.Tensor) -> HeadLoss:
        """states [N, C, D], targets [N, C], row_weight [N] (every codebook of a row) -> total summed over
        the codebooks, CE [N, C], argmax [N, C]. Every head runs once, on possibly empty rows."""
        if targets.shape != states.shape[:2]:
            raise ValueError(f"image targets have shape {list(targets.shape)}, states {list(states.shape)}")
        parts = [head(s, t, row_weight) for head, s, t
                 in zip(self.image, states.unbind(1), targets.unbind(1), strict=True)]
        return HeadLoss(torch.stack([p.total for p in parts]).sum(), torch.stack([p.per_row for p in parts], 1),
                        torch.stack([p.preds for p in parts], 1))
