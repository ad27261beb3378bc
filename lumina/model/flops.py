"""Analytic FLOPs of one training step of a `LuminaModel` on one pack, as torch's `FlopCounterMode` counts
them (what MFU divides by): matrix products only, a multiply-add = 2 FLOPs.
- training = 3 x forward for the GEMMs (each backward forms both operands' gradients; the fused head losses
  form them in their forward), 3.5 x for attention's Q K^T and P V (fused backwards recompute Q K^T);
- activation recompute is not counted (model FLOPs: MFU under checkpointing understates the hardware's load);
- attention counts the (query, key) pairs its backend computes per query head (`Backend.pairs`): S^2 per pack
  for `Pairs.DENSE`, sum of L_i^2 over the segments for `Pairs.SEGMENTS`, the pairs the block-diffusion mask
  allows for `Pairs.ALLOWED` (`flex`; at its 128 x 128 blocks it computes more);
- every position runs through the backbone (tail padding too), k routed experts and the shared one; the text
  head runs on supervised text rows, the image head and the codebook heads on supervised image rows,
  `img_embeddings_proj` on image input rows (types 2 and 4). Left out: the backends' O(S hd^2) fill of fully
  masked padding rows (under 1% at 3% padding).
"""

from __future__ import annotations

import torch

from lumina.attention import Pairs, build_spec
from lumina.attention.backend import backend_class
from lumina.contract.batch import PackedBatch
from lumina.model.config import LuminaConfig
from lumina.model.image_heads import ImageHeadMACs, build_image_head
from lumina.model.supervision import PackRows, segment_lengths

ATTENTION_PARTS = ("attention_core", "channel_attention")  # 3.5 x forward in training; the other parts 3 x


def visible_pairs(batch: PackedBatch, rule: str = "auto") -> int:
    """(query, key) pairs the attention rule allows inside each segment, valid rows only (one host read)."""
    spec = build_spec(batch, backend="segmented", rule=rule)
    bounds = spec.bounds
    counts = [spec.allowed(slice(a, b), slice(a, b)).sum() for a, b in zip(bounds, bounds[1:], strict=False)]
    return int(torch.stack(counts).sum()) if counts else 0


def attention_pairs(batch: PackedBatch, backend: str, rule: str = "auto") -> int:
    """Per query head, the (query, key) pairs `backend` computes on `batch` under the attention `rule`."""
    batch_size, seq_len = batch.type_ids.shape
    pairs = backend_class(backend).pairs
    if pairs is Pairs.DENSE:
        return batch_size * seq_len * seq_len
    if pairs is Pairs.SEGMENTS:
        return batch_size * sum(length * length for length in segment_lengths(batch))
    if pairs is Pairs.ALLOWED:
        return batch_size * visible_pairs(batch, rule)
    raise ValueError(f"attention backend {backend!r}: no FLOP count for its pairs={pairs!r}")


def pack_attention_pairs(batch: PackedBatch, backend: str, rule: str = "auto") -> int:
    """`attention_pairs` of a pack; a window of a pack (sequence parallelism) gets its share: every rank of the
    group attends over the whole pack with heads / sp, the pack's pairs x rows / pack rows per query head."""
    if batch.whole is None:
        return attention_pairs(batch, backend, rule)
    total, start = attention_pairs(batch.whole, backend, rule), batch.window_start
    stop = start + batch.seq_len  # rounded so that the windows' shares add up
    return total * stop // batch.pack_len - total * start // batch.pack_len


def nominal_attention_pairs(rows: PackRows, backend: str) -> int:
    """The pairs of a pack of `rows` in samples of rows.segment_len (`flex`'s bounded by `segmented`'s)."""
    dense = backend_class(backend).pairs is Pairs.DENSE
    return rows.positions * (rows.positions if dense else rows.segment_len)


def batch_flops(config: LuminaConfig, batch: PackedBatch, backend: str) -> int:
    """`training_flops` of one pack (or window of a pack) as `LuminaModel.forward` selects its rows."""
    return training_flops(config, PackRows.of(batch), pack_attention_pairs(batch, backend, config.attn_rule))


_IMAGE_HEAD_MACS: dict[str, ImageHeadMACs] = {}  # by repr(config)


def image_head_macs(config: LuminaConfig) -> ImageHeadMACs:
    """`ImageHead.macs_per_row` of the head `config.image_head` names, built on the meta device (cached)."""
    key = repr(config)
    if key not in _IMAGE_HEAD_MACS:
        with torch.device("meta"):
            _IMAGE_HEAD_MACS[key] = build_image_head(config).macs_per_row()
    return _IMAGE_HEAD_MACS[key]


def forward_flops(config: LuminaConfig, rows: PackRows, pairs: int) -> dict[str, int]:
    """Forward FLOPs by part of one pack of `rows` whose attention computes `pairs` pairs per query head
    (channel_head / channel_attention: the image head's linear layers / attention; image_heads: the C heads)."""
    c = config
    hidden, positions = c.hidden_size, rows.positions
    heads_width = c.num_attention_heads * c.head_dim
    qkv_width = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    dense_layers, moe_layers = c.first_k_dense_replace, c.num_moe_layers
    k = c.num_experts_per_tok
    channel = image_head_macs(config)
    parts = {
        "embed": rows.image_inputs * c.num_codebooks * hidden * hidden,
        "attention": c.num_hidden_layers * positions * hidden * (qkv_width + heads_width),
        "attention_core": c.num_hidden_layers * 2 * pairs * heads_width,
        "dense_ffn": dense_layers * positions * 3 * hidden * c.intermediate_size,
        "router": moe_layers * positions * hidden * c.num_experts,
        "experts": moe_layers * positions * k * 3 * hidden * c.moe_intermediate_size,
        "shared_expert": moe_layers * positions * 3 * hidden * c.shared_expert_size,
        "combine": moe_layers * positions * k * hidden,
        "text_head": rows.text * hidden * c.vocab_size,
        "channel_head": rows.image * channel.linears,
        "channel_attention": rows.image * channel.attention,
        "image_heads": rows.image * c.num_codebooks * hidden * c.codebook_size,
    }
    return {name: 2 * macs for name, macs in parts.items()}


def training_flops(config: LuminaConfig, rows: PackRows, pairs: int) -> int:
    """Forward + backward FLOPs of one pack: 3 x the forward GEMMs, 3.5 x attention (module docstring)."""
    parts = forward_flops(config, rows, pairs)
    attention = sum(parts[name] for name in ATTENTION_PARTS)
    return 3 * (sum(parts.values()) - attention) + 7 * attention // 2
