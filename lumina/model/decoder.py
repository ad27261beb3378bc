"""One pre-norm decoder layer: h += Attn(RMSNorm h); h += FFN(RMSNorm h). FFN is a dense SwiGLU for the first
`first_k_dense_replace` layers and the MoE block after."""

from __future__ import annotations

import torch
from torch import nn

from lumina.model.attention import Attention, KeysValues
from lumina.model.config import LuminaConfig
from lumina.model.layers import RMSNorm
from lumina.model.mlp import SwiGLU
from lumina.model.moe import MoE
from lumina.model.routers import PackRows, Routing


class DecoderLayer(nn.Module):
    def __init__(self, config: LuminaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_moe_layer(layer_idx):
            self.mlp: nn.Module = MoE(config)
        else:
            self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, std=config.initializer_range)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, MoE)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                spec: object, pack: PackRows | None = None,
                kv: KeysValues | None = None) -> tuple[torch.Tensor, Routing | None]:
        """h [B, S, H] -> (h [B, S, H], routing or None for a dense layer); `pack` goes to the router, `kv` (a
        key/value cache's hook) to the attention."""
        h = h + self.attention(self.input_layernorm(h), cos, sin, spec, kv)
        ffn, routing = self.ffn(h, pack)
        return h + ffn, routing

    def ffn(self, h: torch.Tensor, pack: PackRows | None = None) -> tuple[torch.Tensor, Routing | None]:
        """h [B, S, H] -> (FFN(RMSNorm h) [B, S, H], routing or None for a dense layer)."""
        x = self.post_attention_layernorm(h)
        if self.is_moe:
            return self.mlp(x, pack)
        return self.mlp(x), None
