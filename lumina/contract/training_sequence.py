"""`TrainingSequence`: one sample laid out for training (what layout produces and packing concatenates)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainingSequence:
    """One sample, no padding: input_ids, labels [L, C] int64; type_ids, turn_ids, block_ids, position_ids
    [L] int64; is_clean, answer_mask [L] bool; noise_t [L] float32."""

    sample_id: str
    input_ids: torch.Tensor
    labels: torch.Tensor
    type_ids: torch.Tensor
    turn_ids: torch.Tensor
    block_ids: torch.Tensor
    position_ids: torch.Tensor
    is_clean: torch.Tensor
    noise_t: torch.Tensor
    answer_mask: torch.Tensor

    def __len__(self) -> int:
        return self.type_ids.shape[0]
