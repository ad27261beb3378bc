"""Basic layers with the official from-scratch init (HF `_init_weights`): Linear/Embedding N(0, std), zero
biases, zero padding row; RMSNorm with the official fp32 numerics."""

from __future__ import annotations

import torch
from torch import nn


def check_finite(enabled: bool, stage: str, *tensors: torch.Tensor) -> None:
    """Raise FloatingPointError naming `stage` if any tensor holds inf/nan (one host sync; off by default)."""
    if enabled and not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise FloatingPointError(f"non-finite values after {stage}")


class Linear(nn.Linear):
    """`nn.Linear` whose `reset_parameters` draws N(0, std) weights and zero biases."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, std: float = 0.02) -> None:
        self.std = std
        super().__init__(in_features, out_features, bias=bias)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    """`nn.Embedding` whose `reset_parameters` draws N(0, std) and zeroes the padding row."""

    def __init__(self, num_embeddings: int, dim: int, padding_idx: int | None = None, std: float = 0.02) -> None:
        self.std = std
        super().__init__(num_embeddings, dim, padding_idx=padding_idx)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.std)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: normalise in fp32, cast back to the input dtype, then multiply by the weight
    (the official order; the product follows torch type promotion)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def layer_norm(dim: int, affine: bool = True) -> nn.LayerNorm:
    """The channel head's LayerNorm (eps 1e-6, as every LayerNorm of the official head)."""
    return nn.LayerNorm(dim, eps=1e-6, elementwise_affine=affine)
