"""Partial rotary position embedding (default RoPE, 1-D positions), official numerics: cos/sin in fp32,
then cast; rotate-half over the first `rotary_dim` dims of each head only (dim i pairs with i + rotary_dim/2)."""

from __future__ import annotations

import torch
from torch import nn


def inverse_frequencies(rotary_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """inv_freq_j = theta^(-2j / rotary_dim), j = 0..rotary_dim/2 - 1, fp32 [rotary_dim / 2]."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
    return 1.0 / (theta**exponents)


class RotaryEmbedding(nn.Module):
    """`forward(position_ids [B, S], dtype)` -> cos, sin [B, S, rotary_dim] in `dtype` (computed in fp32)."""

    def __init__(self, rotary_dim: int, theta: float) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.register_buffer("inv_freq", inverse_frequencies(rotary_dim, theta), persistent=False)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.inv_freq.copy_(inverse_frequencies(self.rotary_dim, self.theta, self.inv_freq.device))

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq.float()  # [B, S, rotary_dim / 2]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, head_dim]; cos/sin [B, S, rotary_dim]. Rotates dims [0, rotary_dim), keeps the rest."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)
