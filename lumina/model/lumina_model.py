"""`LuminaModel`: the InternLumina-U2 LM (official `LLaDA2MoeModelLM`): backbone + text head + codebook heads +
the image head `config.image_head` names (official: the multi-codebook channel head), with state-dict keys
equal to the official fused layout."""

from __future__ import annotations

import torch
from torch import nn

from lumina.attention import AttentionSpec, CachedStep, build_spec
from lumina.contract.batch import PackedBatch
from lumina.contract.roles import TokenType
from lumina.model.backbone import Backbone
from lumina.model.config import LuminaConfig
from lumina.model.heads import Head, LuminaHeads
from lumina.model.image_heads import ImageHead, SampleFn, image_head_class
from lumina.model.layers import check_finite
from lumina.model.moe import MoE
from lumina.model.output import LuminaOutput
from lumina.model.routers import PackRows
from lumina.model.supervision import check_labels


class LuminaModel(nn.Module):
    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        std = config.initializer_range
        self.model = Backbone(config)
        chunk, check = config.loss_chunk_rows, config.check_finite
        self.lm_head = Head(config.hidden_size, config.vocab_size, std, chunk, check, "text logits")
        self.lm_img_head = nn.ModuleList(
            Head(config.hidden_size, config.codebook_size, std, chunk, check, "image logits")
            for _ in range(config.num_codebooks))
        head = image_head_class(config)
        self.image_head_name = head.module_name  # the attribute holding it: its checkpoint key prefix
        self.add_module(head.module_name, head(config))

    # ---- construction helpers ----
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer per the official from-scratch init; use after
        `to_empty(device=...)` on a model built on the meta device."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def conditional_modules(self) -> dict[str, nn.Module]:
        """Modules whose use depends on batch contents; each runs exactly once per forward (on empty rows
        when the batch lacks that modality), so they always join the autograd graph."""
        return {
            "word_embeddings": self.model.word_embeddings,
            "img_embeddings": self.model.img_embeddings,
            "img_embeddings_proj": self.model.img_embeddings_proj,
            "lm_head": self.lm_head,
            "lm_img_head": self.lm_img_head,
            self.image_head_name: self.image_head,
        }

    @property
    def image_head(self) -> ImageHead:
        """The image head (`ImageHead`; official: `multi_codebook_head`)."""
        return getattr(self, self.image_head_name)

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoE)]

    # ---- public parts for samplers ----
    def backbone(self, batch: PackedBatch, cache: CachedStep | None = None) -> torch.Tensor:
        """Final-normed hidden states [B, S, H]. With `cache` (`lumina.attention.KVCache.step`), `batch` is its
        `queries`: they attend the cached key rows too, and the rows the rule makes final join the cache."""
        spec = self._prologue(batch, cache)
        embeds, _ = self.model.embed(batch.input_ids, batch.type_ids)
        return self.model.decode(embeds, batch.position_ids, spec, _pack_rows(batch), cache)[0]

    def _prologue(self, batch: PackedBatch, cache: CachedStep | None = None) -> AttentionSpec:
        """What `forward` and `backbone` do first: the pack's attention spec (keys: the cache's key rows)."""
        spec = build_spec(batch, backend=self.model.attn_backend, strict=self.config.attn_strict,
                          rule=self.config.attn_rule, keys=None if cache is None else cache.keys)
        if cache is not None:
            cache.begin(spec)
        return spec

    def heads(self) -> LuminaHeads:
        """The one way to the output heads: logits on demand and the fused losses (also `LuminaOutput.heads`)."""
        return LuminaHeads(self.lm_head, self.lm_img_head)

    def sample_image_codes(self, h_rows: torch.Tensor, sample_fn: SampleFn) -> tuple[torch.Tensor, torch.Tensor]:
        """The image head's sampling at h_rows [N, H] -> (codes [N, C], probabilities [N, C]); see
        `ImageHead.sample`."""
        return self.image_head.sample(h_rows, sample_fn, self.model.img_embeddings, self.lm_img_head)

    # ---- training forward ----
    def select_rows(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (text_rows [Nt], image_rows [Ni], teacher-forcing codes [Ni or 0, C]) as flat row indices.

        With labels: `check_labels`, the one check of the labels' values in a step. Without labels:
        the candidates are `batch.query_rows` (all rows if None); text rows are those of type != 4, image rows
        those of type 4, and there are no teacher-forcing codes."""
        cfg = self.config
        types = batch.type_ids.reshape(-1)
        n_codebooks = cfg.num_codebooks
        if batch.labels is None:
            rows = batch.query_rows if batch.query_rows is not None else torch.arange(types.numel())
            rows = rows.to(types.device)
            if rows.numel() and bool(((rows < 0) | (rows >= types.numel())).any()):
                raise ValueError(f"query_rows out of range [0, {types.numel()}): {rows[:8].tolist()}")
            is_image = types[rows] == TokenType.IMAGE_ANSWER
            return rows[~is_image], rows[is_image], batch.input_ids.new_zeros(0, n_codebooks)
        text_rows, image_rows = check_labels(batch, cfg.vocab_size, cfg.codebook_size, n_codebooks)
        labels = batch.labels.reshape(types.numel(), -1)
        codes = labels[image_rows] if image_rows.numel() else labels.new_zeros(0, n_codebooks)
        return text_rows, image_rows, codes

    def forward(self, batch: PackedBatch) -> LuminaOutput:
        cfg = self.config
        check = cfg.check_finite
        spec = self._prologue(batch)
        text_rows, image_rows, codes = self.select_rows(batch)
        head = self.image_head
        if not head.teacher_forced:
            codes = codes[:0]
        embeds, code_embeds = self.model.embed(batch.input_ids, batch.type_ids, extra_codes=codes)
        check_finite(check, "embeddings", embeds, code_embeds)
        hidden, routings = self.model.decode(embeds, batch.position_ids, spec, _pack_rows(batch))
        check_finite(check, "backbone", hidden)

        flat = hidden.reshape(-1, hidden.shape[-1])
        forced_rows = image_rows if batch.labels is not None else image_rows[:0]
        states = head(flat[forced_rows], code_embeds[:, :-1])
        check_finite(check, "channel head", states)

        batch_size, seq = hidden.shape[:2]
        return LuminaOutput(
            hidden=hidden, text_states=flat[text_rows], text_rows=text_rows,
            image_states=states, image_rows=image_rows, heads=self.heads(),
            router_logits=[r.logits.view(batch_size, seq, -1) for r in routings],
            router_topk_ids=[r.topk_ids.view(batch_size, seq, -1) for r in routings],
            router_topk_weights=[r.topk_weights.view(batch_size, seq, -1) for r in routings],
        )


def _pack_rows(batch: PackedBatch) -> PackRows:
    """The rows of its pack `batch` holds (the routers draw their selection noise per pack)."""
    return PackRows(batch.window_start, batch.pack_len)
