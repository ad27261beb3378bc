"""SwiGLU MLP: down(silu(gate x) * up x). Used for the dense layers and the shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lumina.model.layers import Linear


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, std: float = 0.02) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, std=std)
        self.up_proj = Linear(hidden_size, intermediate_size, std=std)
        self.down_proj = Linear(intermediate_size, hidden_size, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> [..., H]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
