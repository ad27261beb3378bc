"""`ObjectiveResult`: what one micro-batch's objective returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ObjectiveResult:
    """`loss` carries the graph; the rest is detached. Terms are this rank's share, sum_local / N_global *
    world_size: log them with a mean over the data-parallel ranks (the global-token mean)."""

    loss: torch.Tensor  # scalar, what to backward (text + image + balance, weighted)
    text_loss: torch.Tensor  # scalar, sum(w * CE_text) / N_txt_global * world_size (unweighted by text_weight)
    image_loss: torch.Tensor  # scalar, sum_cells(mean_c CE_c) / N_img_global * world_size
    image_loss_per_codebook: torch.Tensor  # [C], sum_cells(CE_c) / N_img_global * world_size
    balance_loss: torch.Tensor  # scalar, aux_coef * mean over layers of E * sum f P (0 when off)
    num_text_local: torch.Tensor  # int64 scalars: the N of each term, this rank's and summed over ranks
    num_text_global: torch.Tensor
    num_image_local: torch.Tensor
    num_image_global: torch.Tensor
    text_preds: torch.Tensor  # [Nt] argmax predictions at the output's text rows
    text_targets: torch.Tensor  # [Nt]
    image_preds: torch.Tensor  # [Ni, C] argmax predictions at the output's image rows
    image_targets: torch.Tensor  # [Ni, C]
    expert_load: torch.Tensor  # [L, E] float32 top-k counts of valid tokens per MoE layer
