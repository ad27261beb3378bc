"""Summed cross-entropies of the text and image heads (fp32; an empty row set gives an exact, connected 0)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def text_ce(text_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """text_logits [Nt, V], targets [Nt] -> per-token CE [Nt] (fp32)."""
    return F.cross_entropy(text_logits.float(), targets, reduction="none")


def image_ce(image_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """image_logits [Ni, C, K], targets [Ni, C] -> per-cell, per-codebook CE [Ni, C] (fp32)."""
    num_cells, num_codebooks, codebook_size = image_logits.shape
    if targets.shape != (num_cells, num_codebooks):
        raise ValueError(f"image targets have shape {list(targets.shape)}, image_logits {list(image_logits.shape)}")
    flat = F.cross_entropy(image_logits.float().reshape(-1, codebook_size), targets.reshape(-1), reduction="none")
    return flat.view(num_cells, num_codebooks)
