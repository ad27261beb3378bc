"""The backbone (`model.*` keys): embeddings, decoder layers, final RMSNorm."""

from __future__ import annotations

import logging

import torch
from torch import nn

from lumina.attention import CachedStep, resolve_backend
from lumina.model.config import LuminaConfig
from lumina.model.decoder import DecoderLayer
from lumina.model.layers import Embedding, Linear, RMSNorm
from lumina.model.rotary import RotaryEmbedding
from lumina.model.routers import PackRows, Routing
from lumina.model.supervision import is_image_code_row

log = logging.getLogger(__name__)


class Backbone(nn.Module):
    """`attn_backend`: the attention backend this model runs (config.attn_backend, "auto" resolved once here)."""

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = resolve_backend(config.attn_backend)
        log.info("attention backend: %s (attn_backend=%s)", self.attn_backend, config.attn_backend)
        std = config.initializer_range
        h = config.hidden_size
        self.word_embeddings = Embedding(config.vocab_size, h, padding_idx=config.pad_token_id, std=std)
        self.img_embeddings = nn.ModuleList(
            Embedding(config.image_vocab_size, h, std=std) for _ in range(config.num_codebooks))
        self.img_embeddings_proj = Linear(config.num_codebooks * h, h, std=std)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dims, config.rope_theta)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int64 [N, C] -> per-codebook embeddings [N, C, H] (one call of each `img_embeddings[c]`)."""
        return torch.stack([table(codes[:, c]) for c, table in enumerate(self.img_embeddings)], dim=1)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor,
              extra_codes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, S, C] (or [B, S, 1] text-only), type_ids [B, S]; extra_codes [M, C] (e.g. teacher-forcing
        labels) share the image tables' single call -> (embeds [B, S, H], extra embeds [M, C, H]). Rows of type
        2/4 project their C code embeddings with `img_embeddings_proj`, the others embed column 0 with
        `word_embeddings`; each table runs exactly once, on possibly empty rows."""
        cfg = self.config
        batch, seq, cols = input_ids.shape
        n_codebooks = cfg.num_codebooks
        flat_ids = input_ids.reshape(batch * seq, cols)
        flat_types = type_ids.reshape(batch * seq)
        is_image = is_image_code_row(flat_types)
        image_rows = is_image.nonzero().squeeze(1)
        text_rows = (~is_image).nonzero().squeeze(1)
        if cols != n_codebooks and (cols != 1 or image_rows.numel()):
            raise ValueError(f"input_ids has {cols} columns; expected num_codebooks={n_codebooks} "
                             f"(or 1 for a batch without rows of type 2/4)")
        if extra_codes is None:
            extra_codes = flat_ids.new_zeros(0, n_codebooks)
        if extra_codes.dim() != 2 or extra_codes.shape[1] != n_codebooks:
            raise ValueError(f"extra_codes has shape {list(extra_codes.shape)}, expected [M, {n_codebooks}]")
        word_ids = flat_ids[text_rows, 0]
        image_codes = flat_ids[image_rows] if cols == n_codebooks else flat_ids.new_zeros(0, n_codebooks)
        codes = torch.cat([image_codes, extra_codes.to(flat_ids.device, torch.long)], dim=0)
        _check_range("input_ids (text rows, column 0)", word_ids, cfg.vocab_size,
                     "input_ids / extra_codes (image codes)", codes, cfg.image_vocab_size)

        words = self.word_embeddings(word_ids)  # [Nt, H]
        code_embeds = self.embed_codes(codes)  # [Ni + M, C, H]
        n_image = image_codes.shape[0]
        images = self.img_embeddings_proj(code_embeds[:n_image].reshape(n_image, n_codebooks * cfg.hidden_size))
        out = words.new_zeros(batch * seq, cfg.hidden_size)
        out = out.index_copy(0, text_rows, words).index_copy(0, image_rows, images.to(words.dtype))
        return out.view(batch, seq, cfg.hidden_size), code_embeds[n_image:]

    def decode(self, embeds: torch.Tensor, position_ids: torch.Tensor,
               spec: object, pack: PackRows | None = None,
               cache: CachedStep | None = None) -> tuple[torch.Tensor, list[Routing]]:
        """embeds [B, S, H], position_ids [B, S] -> (final-normed hidden [B, S, H], routing per MoE layer);
        `pack` tells the routers where the rows sit in their pack (None: the rows are the whole pack); `cache`
        gives each layer's attention its cached key rows."""
        cos, sin = self.rotary_emb(position_ids, embeds.dtype)
        h = embeds
        routings = []
        for i, layer in enumerate(self.layers):
            h, routing = layer(h, cos, sin, spec, pack, None if cache is None else cache.layer(i))
            if routing is not None:
                routings.append(routing)
        return self.norm(h), routings


def _check_range(name_a: str, a: torch.Tensor, limit_a: int, name_b: str, b: torch.Tensor, limit_b: int) -> None:
    """Raise ValueError when ids fall outside [0, limit) (one host sync for both)."""
    bad_a = (a < 0) | (a >= limit_a)
    bad_b = (b < 0) | (b >= limit_b)
    if bool(bad_a.any() | bad_b.any()):
        if bad_a.any():
            raise ValueError(f"{name_a} out of range [0, {limit_a}): e.g. {a[bad_a][:4].tolist()}")
        raise ValueError(f"{name_b} out of range [0, {limit_b}): e.g. {b[bad_b][:4].tolist()}")
