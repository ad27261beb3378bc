"""The official image head `channel_ar` (`multi_codebook_head.*`): a small adaLN transformer run causally over
the C codebooks of one image row, so codebook c is predicted from the backbone state h and codes 0..c-1.

Input positions: [cond, emb_0, ..., emb_{C-2}] + channel_embed, cond = condition_proj(h); the adaLN condition
at position j is cond + timesteps_embeddings[j]. Output position j feeds `lm_img_head[j]` (held by the LM)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.model.image_heads import IMAGE_HEADS, ImageHead, ImageHeadMACs, SampleFn
from lumina.model.layers import Linear, layer_norm


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def causal_channel_mask(num_codebooks: int, device: torch.device | None = None) -> torch.Tensor:
    """bf16 [C, C]: 0 on and below the diagonal, -inf above."""
    upper = torch.ones(num_codebooks, num_codebooks, dtype=torch.bool, device=device).triu(1)
    mask = torch.zeros(num_codebooks, num_codebooks, device=device).masked_fill(upper, float("-inf"))
    return mask.to(torch.bfloat16)


class ChannelAttention(nn.Module):
    """Multi-head attention over channel positions with a per-head LayerNorm (weight + bias) on q and k."""

    def __init__(self, dim: int, num_heads: int, std: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = Linear(dim, 3 * dim, bias=True, std=std)
        self.q_norm = layer_norm(self.head_dim)
        self.k_norm = layer_norm(self.head_dim)
        self.proj = Linear(dim, dim, bias=True, std=std)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: list[torch.Tensor] | None = None
                ) -> torch.Tensor:
        """x [N, L, D], additive mask [L, L] -> [N, L, D]. With `cache` ([k, v] of the earlier positions, [] at
        the first): x is the next position alone [N, 1, D], attending to those and itself (mask None); its k and
        v are appended to the cache."""
        n, length, dim = x.shape
        qkv = self.qkv(x).view(n, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # [N, heads, L, hd]
        q, k = self.q_norm(q), self.k_norm(k)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype))
        return self.proj(out.transpose(1, 2).reshape(n, length, dim))


class ChannelMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, std: float) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=True, std=std)
        self.fc2 = Linear(hidden, dim, bias=True, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class ChannelBlock(nn.Module):
    """adaLN block; modulation chunks (shift_attn, scale_attn, gate_attn, shift_mlp, scale_mlp, gate_mlp)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int, std: float) -> None:
        super().__init__()
        self.norm1 = layer_norm(dim)
        self.attn = ChannelAttention(dim, num_heads, std)
        self.norm2 = layer_norm(dim)
        self.mlp = ChannelMLP(dim, dim * mlp_ratio, std)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(dim, 6 * dim, bias=True, std=std))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mask: torch.Tensor | None,
                cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """x, cond [N, L, D]; mask [L, L] -> [N, L, D]; `cache`: see `ChannelAttention.forward`."""
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN_modulation(cond).chunk(6, dim=-1)
        x = x + gate_a * self.attn(modulate(self.norm1(x), shift_a, scale_a), mask, cache)
        return x + gate_m * self.mlp(modulate(self.norm2(x), shift_m, scale_m))


class ChannelFinal(nn.Module):
    """Final adaLN layer: parameter-free LayerNorm, modulation chunks (scale, shift)."""

    def __init__(self, dim: int, std: float) -> None:
        super().__init__()
        self.norm_final = layer_norm(dim, affine=False)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(dim, 2 * dim, bias=True, std=std))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.adaLN_modulation(cond).chunk(2, dim=-1)
        return modulate(self.norm_final(x), shift, scale)


@IMAGE_HEADS.register("channel_ar", official=True)
class MultiCodebookHead(ImageHead):
    """Channel-autoregressive (module docstring); teacher-forced in training."""

    module_name = "multi_codebook_head"
    teacher_forced = True
    buffer_dtypes = {"channel_mask": torch.bfloat16}

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__(config)
        dim = config.hidden_size  # the head's width D equals H
        std = config.initializer_range
        self.std = std
        # own tensors first and initialised now: construction draws in `modules()` order, as `init_weights`
        # and a sharding strategy's unit-by-unit materialisation do
        self.channel_embed = nn.Parameter(torch.empty(1, config.num_codebooks, dim))
        self.timesteps_embeddings = nn.Parameter(torch.empty(1, config.num_codebooks, dim))
        self.register_buffer("channel_mask", causal_channel_mask(config.num_codebooks))
        self.reset_parameters()
        self.condition_proj = Linear(config.hidden_size, dim, bias=True, std=std)
        self.channel_blocks = nn.ModuleList(
            ChannelBlock(dim, config.channel_heads, config.channel_mlp_ratio, std)
            for _ in range(config.channel_depth))
        self.channel_norm = layer_norm(dim)
        self.channel_final = ChannelFinal(dim, std)

    def reset_parameters(self) -> None:
        """Own tensors only: bare Parameters N(0, std) [inferred: not fixed by the release], the mask rebuilt."""
        nn.init.normal_(self.channel_embed, mean=0.0, std=self.std)
        nn.init.normal_(self.timesteps_embeddings, mean=0.0, std=self.std)
        with torch.no_grad():
            self.channel_mask.copy_(causal_channel_mask(self.num_codebooks, self.channel_mask.device))

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module signature
        super()._apply(fn, recurse)
        if self.channel_mask.dtype != torch.bfloat16:  # the official buffer is bf16 whatever the model dtype
            self.channel_mask = self.channel_mask.to(torch.bfloat16)
        return self

    def run(self, cond: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """cond [N, D] (= condition_proj(h)); prefix [N, L - 1, D] code embeddings -> states [N, L, D]."""
        length = prefix.shape[1] + 1
        x = torch.cat([cond.unsqueeze(1), prefix.to(cond.dtype)], dim=1) + self.channel_embed[:, :length]
        ada = cond.unsqueeze(1) + self.timesteps_embeddings[:, :length]
        mask = self.channel_mask[:length, :length]
        for block in self.channel_blocks:
            x = block(x, ada, mask)
        return self.channel_final(self.channel_norm(x), ada)

    def forward(self, h: torch.Tensor, code_embeds: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: code_embeds [N, C - 1, H] = img_embeddings[c](code c) for c < C - 1."""
        if code_embeds.shape[1] != self.num_codebooks - 1:
            raise ValueError(f"code_embeds has {code_embeds.shape[1]} codebooks, expected {self.num_codebooks - 1}")
        return self.run(self.condition_proj(h), code_embeds)

    @torch.no_grad()
    def sample(self, h: torch.Tensor, sample_fn: SampleFn, img_embeddings: nn.ModuleList,
               lm_img_head: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, H] -> (codes int64 [N, C], probabilities [N, C]). For c = 0..C-1: the blocks on position c
        alone, attending to the K/V cache of positions < c (what `run` computes on the whole prefix, as the
        blocks are causal and position c's adaLN condition is its own: C positions computed instead of
        C (C + 1) / 2), `lm_img_head[c]` on it, `sample_fn(logits [N, K], c)` picks, `img_embeddings[c]` embeds
        the picks as position c + 1's input."""
        cond = self.condition_proj(h)
        caches: list[list[torch.Tensor]] = [[] for _ in self.channel_blocks]
        x = cond.unsqueeze(1)  # position 0's input
        codes, probs = [], []
        for c in range(self.num_codebooks):
            x = x + self.channel_embed[:, c:c + 1]
            ada = cond.unsqueeze(1) + self.timesteps_embeddings[:, c:c + 1]
            for block, cache in zip(self.channel_blocks, caches, strict=True):
                x = block(x, ada, None, cache)
            state = self.channel_final(self.channel_norm(x), ada)[:, 0]
            tokens, p = sample_fn(lm_img_head[c](state), c)
            codes.append(tokens.long())
            probs.append(p)
            if c + 1 < self.num_codebooks:
                x = img_embeddings[c](tokens.long()).to(cond.dtype).unsqueeze(1)
        return torch.stack(codes, dim=1), torch.stack(probs, dim=1)

    @classmethod
    def state_shapes(cls, config: LuminaConfig) -> dict[str, tuple[int, ...]]:
        d, n_cb = config.hidden_size, config.num_codebooks
        head_dim, mlp = d // config.channel_heads, config.channel_mlp_ratio * d
        block = (("norm1", (d,)), ("attn.qkv", (3 * d, d)), ("attn.q_norm", (head_dim,)),
                 ("attn.k_norm", (head_dim,)), ("attn.proj", (d, d)), ("norm2", (d,)), ("mlp.fc1", (mlp, d)),
                 ("mlp.fc2", (d, mlp)), ("adaLN_modulation.1", (6 * d, d)))
        layers = [(f"channel_blocks.{i}.{name}", shape) for i in range(config.channel_depth) for name, shape in block]
        layers += [("channel_norm", (d,)), ("channel_final.adaLN_modulation.1", (2 * d, d))]
        shapes = {"condition_proj.weight": (d, d), "condition_proj.bias": (d,), "channel_embed": (1, n_cb, d),
                  "timesteps_embeddings": (1, n_cb, d), "channel_mask": (n_cb, n_cb)}
        for name, shape in layers:  # each with a weight and a bias
            shapes[f"{name}.weight"] = shape
            shapes[f"{name}.bias"] = shape[:1]
        return shapes

    def macs_per_row(self) -> ImageHeadMACs:
        """`condition_proj` once per row, the other linear layers per position; attention C x C, computed dense."""
        positions, cond = self.num_codebooks, self.condition_proj
        per_position = sum(m.in_features * m.out_features for m in self.modules()
                           if isinstance(m, nn.Linear) and m is not cond)
        attention = sum(2 * positions * positions * m.num_heads * m.head_dim
                        for m in self.modules() if isinstance(m, ChannelAttention))
        return ImageHeadMACs(cond.in_features * cond.out_features + positions * per_position, attention)
