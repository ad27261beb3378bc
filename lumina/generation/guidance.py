"""Classifier-free guidance (contract 6.3) on the final hidden states of image-answer rows or on the channel
head's logits per codebook: the same formulas on [N, D] tensors."""

from __future__ import annotations

import torch


def guide_single(h_cond: torch.Tensor, h_uncond: torch.Tensor | None, scale: float) -> torch.Tensor:
    """h_cond, h_uncond [N, D] -> (1 + s) h_c - s h_u for s > 0; h_c for s = 0 (or no negative branch);
    h_u for s < 0."""
    if h_uncond is None or scale == 0:
        return h_cond
    if scale < 0:
        return h_uncond
    return (1 + scale) * h_cond - scale * h_uncond


def guide_dual(h_cond: torch.Tensor, h_uncond_text: torch.Tensor, h_uncond_image: torch.Tensor,
               text_scale: float, image_scale: float) -> torch.Tensor:
    """Editing with two scales: h_c + s_t (h_c - h_ut) + s_i (h_c - h_ui); all [N, D]."""
    return h_cond + text_scale * (h_cond - h_uncond_text) + image_scale * (h_cond - h_uncond_image)
