"""The backbone's self-attention block: fused QKV -> per-head RMSNorm on q and k -> partial RoPE -> packed
attention (`core`, non-causal, GQA, scale 1/sqrt(head_dim)) -> `dense`.

`core` is the seam where the rows meet: `lumina.attention.attend` when this device holds the whole pack;
sequence parallelism swaps in an all-to-all around it (`lumina.distributed.sequence_parallel.UlyssesAttention`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lumina.attention import attend
from lumina.model.config import LuminaConfig
from lumina.model.layers import Linear, RMSNorm
from lumina.model.rotary import apply_rotary

AttentionCore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]
# a key/value cache's hook for one layer (`lumina.attention.CachedStep.layer`): k, v of the rows this forward
# computes [B, nkv, S, hd] -> k, v of every key row the spec names [B, nkv, Lk, hd]
KeysValues = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.compiler.disable
def run_core(core: AttentionCore, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: object) -> torch.Tensor:
    """`core(q, k, v, spec)`, never compiled: the spec's host facts (segment bounds, plain runs) plan the calls."""
    return core(q, k, v, spec)


class Attention(nn.Module):
    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.core: AttentionCore = attend  # (q [B, nh, S, hd], k, v [B, nkv, S, hd], spec) -> [B, nh, S, hd]
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        std = config.initializer_range
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        # rows: Q (head-major), then K, then V
        self.query_key_value = Linear(config.hidden_size, qkv_rows, bias=config.use_qkv_bias, std=std)
        self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.dense = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias, std=std)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: object,
                kv: KeysValues | None = None) -> torch.Tensor:
        """x [B, S, H]; cos/sin [B, S, rotary_dim]; spec from `lumina.attention.build_spec` -> [B, S, H]. `kv`:
        a cache's hook giving the key rows (cached ones first) for these query rows."""
        batch, seq, _ = x.shape
        qkv = self.query_key_value(x).view(batch, seq, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        q = self.query_layernorm(q.transpose(1, 2))  # [B, nh, S, hd]
        k = self.key_layernorm(k.transpose(1, 2))  # [B, nkv, S, hd]
        v = v.transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv is not None:
            k, v = kv(k, v)
        out = run_core(self.core, q, k, v, spec)  # [B, nh, S, hd]
        return self.dense(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))
