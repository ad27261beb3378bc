"""`LuminaConfig`: every field of the official `config.json`, the sizes the official code hard-codes,
and lumina's training knobs. `from_hf` / `to_hf` read and write the official file."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumina.attention import check_backend_name
from lumina.attention.rules import check_rule_name
from lumina.schedules import DEFAULT_SCHEDULE, build_schedule

MOE_BACKENDS = ("grouped_mm", "loop")
# Activation checkpointing of the backbone (see `LuminaConfig.gradient_checkpointing`).
CHECKPOINT_POLICIES = ("none", "full", "selective")
ROUTER_INITS = ("kaiming_uniform", "normal")  # see `LuminaConfig.router_init`

# Fields of the official config.json, in the file's own order; `to_hf` writes exactly these (+ unknown keys).
OFFICIAL_KEYS = (
    "architectures", "attention_dropout", "auto_map", "num_hidden_layers", "hidden_size", "intermediate_size",
    "first_k_dense_replace", "hidden_act", "max_position_embeddings", "model_type", "moe_intermediate_size",
    "norm_topk_prob", "num_experts_per_tok", "norm_head", "num_attention_heads", "num_experts",
    "num_key_value_heads", "rope_theta", "rope_scaling", "tie_word_embeddings", "torch_dtype",
    "transformers_version", "use_bias", "use_rmsnorm", "rms_norm_eps", "head_dim", "num_shared_experts",
    "use_cache", "use_qkv_bias", "embedding_dropout", "norm_softmax", "output_dropout", "vocab_size",
    "rotary_dim", "using_split_qkv_in_self_attention", "router_dtype", "moe_router_enable_expert_bias",
    "routed_scaling_factor", "n_group", "topk_group", "score_function", "initializer_range",
    "max_window_layers", "output_router_logits", "pad_token_id", "partial_rotary_factor",
    "use_sliding_window", "num_codebooks",
)
# Sizes the official code hard-codes; written to config.json too (the official loader ignores them).
HARD_CODED_KEYS = (
    "image_vocab_size", "codebook_size", "channel_depth", "channel_heads", "channel_mlp_ratio",
)
# Research parts chosen by name (lumina.parts); written to config.json so lumina's reader rebuilds the same model
# (a config.json without them gets the official parts, the defaults).
PART_KEYS = ("image_head", "masking_schedule", "attn_rule")
# lumina-only runtime choices; never written to config.json.
TRAINING_KEYS = ("attn_backend", "attn_strict", "moe_backend", "gradient_checkpointing", "check_finite",
                 "loss_chunk_rows", "router_init")

DEFAULT_AUTO_MAP = {
    "AutoConfig": "configuration_internluminau2.LLaDA2MoeConfig",
    "AutoModel": "modeling_internluminau2.LLaDA2MoeModel",
    "AutoModelForCausalLM": "modeling_internluminau2.LLaDA2MoeModelLM",
}


def checkpoint_policy(value: object, name: str = "LuminaConfig.gradient_checkpointing") -> str:
    """A checkpointing policy from its name or a legacy bool (True -> "full", False -> "none"); anything else
    raises ValueError naming `name` and the value."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str) and value in CHECKPOINT_POLICIES:
        return value
    raise ValueError(f"{name}={value!r}: must be one of {CHECKPOINT_POLICIES} (or a legacy bool)")


@dataclass
class LuminaConfig:
    """gradient_checkpointing: what the backbone recomputes in backward (only while autograd records):
      none       nothing; every activation is kept.
      full       each decoder layer; only its input [B, S, H] is kept.
      selective  each layer's FFN sub-block (post-attention RMSNorm -> router -> dispatch -> experts ->
                 combine, + shared expert; the dense SwiGLU of the first layers); the attention block's
                 activations are kept. The MoE's k dispatched copies per token dominate the stored bytes and
                 cost only GEMMs to redo, while the attention core is the O(S^2) part of a recompute.
    Both full and selective also checkpoint the channel head, 128 image rows at a time: at about
    C * channel_depth * 20 * H floats per supervised image row it holds the most activations per row.
    Every router's top-k is replayed on recompute, so each policy gives the gradients of `none` exactly.
    The model's code does not read it: the training build (`LuminaModule.configure_model`) applies it with
    `lumina.model.activation_checkpointing.apply_checkpointing(model, policy)`, which any other builder can call too.

    router_init: the from-scratch init of each router's `gate.weight`: "kaiming_uniform" (nn.Linear's default,
    what the official code gets) or "normal" (N(0, initializer_range), as torchtitan and Megatron initialise
    routers). The smaller normal init starts every expert's score near 0.5, so the expert bias, not the first
    random weights, decides where tokens go at the start (experiments/expert_balance.md)."""

    # --- official config.json (defaults = the released 16B-A1B file) ---
    architectures: list[str] = field(default_factory=lambda: ["LLaDA2MoeModelLM"])
    attention_dropout: float = 0.0
    auto_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_AUTO_MAP))
    num_hidden_layers: int = 20
    hidden_size: int = 2048
    intermediate_size: int = 5120
    first_k_dense_replace: int = 1
    hidden_act: str = "silu"
    max_position_embeddings: int = 16384
    model_type: str = "llada2_moe"
    moe_intermediate_size: int = 512
    norm_topk_prob: bool = True
    num_experts_per_tok: int = 8
    norm_head: bool = False
    num_attention_heads: int = 16
    num_experts: int = 256
    num_key_value_heads: int = 4
    rope_theta: float = 600000
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    transformers_version: str = "4.52.3"
    use_bias: bool = False
    use_rmsnorm: bool = True
    rms_norm_eps: float = 1e-6
    head_dim: int = 128
    num_shared_experts: int | None = 1
    use_cache: bool = False
    use_qkv_bias: bool = False
    embedding_dropout: float = 0.0
    norm_softmax: bool = False
    output_dropout: float = 0.0
    vocab_size: int = 157184
    rotary_dim: int | None = 64
    using_split_qkv_in_self_attention: bool = False
    router_dtype: str = "fp32"
    moe_router_enable_expert_bias: bool = True
    routed_scaling_factor: float = 2.5
    n_group: int = 8
    topk_group: int = 4
    score_function: str = "sigmoid"
    initializer_range: float = 0.02
    max_window_layers: int = 28
    output_router_logits: bool = False
    pad_token_id: int = 156892
    partial_rotary_factor: float = 0.5
    use_sliding_window: bool = False
    num_codebooks: int = 8
    # --- sizes the official code hard-codes ---
    image_vocab_size: int = 5010  # rows of each img_embeddings table
    codebook_size: int = 4096  # classes of each lm_img_head
    channel_depth: int = 6
    channel_heads: int = 8
    channel_mlp_ratio: int = 4
    # --- lumina research parts (PART_KEYS; names in their registries) ---
    image_head: str = "channel_ar"  # lumina.model.image_heads: channel_ar (official) | parallel | a dotted path
    masking_schedule: str = DEFAULT_SCHEDULE  # a `lumina.schedules` part: training noise, ELBO weight, samplers
    attn_rule: str = "auto"  # a lumina.attention.RULES name or dotted path; auto: the official choice per pack
    # --- lumina training knobs ---
    attn_backend: str = "auto"  # a lumina.attention.BACKENDS name or dotted path; auto: resolved at model build
    attn_strict: bool = False
    moe_backend: str = "grouped_mm"
    gradient_checkpointing: str = "none"  # none | full | selective (legacy bools: True = full, False = none)
    check_finite: bool = False
    loss_chunk_rows: int = 0  # rows per chunk of the fused head losses; 0 = rows whose fp32 logits fit 256 MiB
    router_init: str = "kaiming_uniform"  # kaiming_uniform | normal (N(0, initializer_range))
    # keys of a config.json lumina does not know; kept and written back by to_hf
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived sizes ----
    @property
    def rotary_dims(self) -> int:
        """Number of rotated dims per head (official: head_dim * partial_rotary_factor = 64)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def shared_expert_size(self) -> int:
        """Width of the shared expert; the official code builds one only when num_shared_experts is not None."""
        return 0 if self.num_shared_experts is None else self.moe_intermediate_size * self.num_shared_experts

    def is_moe_layer(self, layer_idx: int) -> bool:
        return layer_idx >= self.first_k_dense_replace

    # ---- validation ----
    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"LuminaConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "num_experts", "num_experts_per_tok", "n_group", "topk_group", "moe_intermediate_size",
                     "intermediate_size", "vocab_size", "num_codebooks", "image_vocab_size", "codebook_size",
                     "channel_depth", "channel_heads", "channel_mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(name, "must be a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            bad("num_attention_heads", f"not divisible by num_key_value_heads={self.num_key_value_heads}")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            bad("first_k_dense_replace", f"must lie in [0, num_hidden_layers={self.num_hidden_layers}]")
        if self.num_experts % self.n_group:
            bad("n_group", f"does not divide num_experts={self.num_experts}")
        if self.num_experts // self.n_group < 2:
            bad("n_group", "each group needs at least 2 experts (a group is scored by its two best experts)")
        if self.topk_group > self.n_group:
            bad("topk_group", f"larger than n_group={self.n_group}")
        if self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
            bad("num_experts_per_tok",
                f"larger than the {self.topk_group * (self.num_experts // self.n_group)} experts that "
                f"topk_group={self.topk_group} groups of {self.num_experts // self.n_group} hold")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            bad("partial_rotary_factor", "must lie in (0, 1]")
        if self.rotary_dims % 2:
            bad("partial_rotary_factor", f"gives an odd rotary dim {self.rotary_dims} (head_dim={self.head_dim})")
        if self.rotary_dim is not None and self.rotary_dim != self.rotary_dims:
            bad("rotary_dim", f"disagrees with head_dim * partial_rotary_factor = {self.rotary_dims}")
        if self.rope_scaling is not None:
            bad("rope_scaling", "only default RoPE (null) is supported, as in the official model")
        if self.hidden_act != "silu":
            bad("hidden_act", "only 'silu' is supported, as in the official model")
        if self.hidden_size % self.channel_heads:
            bad("channel_heads", f"does not divide hidden_size={self.hidden_size}")
        if self.codebook_size > self.image_vocab_size:
            bad("codebook_size", f"larger than image_vocab_size={self.image_vocab_size}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            bad("pad_token_id", f"outside the text vocab [0, {self.vocab_size})")
        if self.num_shared_experts is not None and self.num_shared_experts < 0:
            bad("num_shared_experts", "must be None or >= 0")
        if not isinstance(self.image_head, str) or not self.image_head:
            bad("image_head", "must name an image head (lumina.model.image_heads) or a dotted path to one")
        check_backend_name(self.attn_backend, "LuminaConfig.attn_backend")
        check_rule_name(self.attn_rule, "LuminaConfig.attn_rule")
        if isinstance(self.loss_chunk_rows, bool) or not isinstance(self.loss_chunk_rows, int) \
                or self.loss_chunk_rows < 0:
            bad("loss_chunk_rows", "must be an integer >= 0 (0 = auto)")
        self.gradient_checkpointing = checkpoint_policy(self.gradient_checkpointing)
        if self.router_init not in ROUTER_INITS:
            bad("router_init", f"must be one of {ROUTER_INITS}")
        build_schedule(self.masking_schedule)
        if self.moe_backend not in MOE_BACKENDS:
            bad("moe_backend", f"must be one of {MOE_BACKENDS}")
        if self.model_type not in ("llada2_moe", "llada2_moe_veomni"):
            bad("model_type", "must be 'llada2_moe' (split experts) or 'llada2_moe_veomni' (fused experts)")

    # ---- presets ----
    @classmethod
    def official(cls, **overrides: Any) -> LuminaConfig:
        """The released InternLumina-U2 16B-A1B config."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides: Any) -> LuminaConfig:
        """A CPU-sized model with every structural feature of the official one (dense layer 0, grouped
        routing, shared expert, GQA, partial rotary, multi-codebook channel head)."""
        sizes: dict[str, Any] = dict(
            num_hidden_layers=3, hidden_size=64, intermediate_size=128, first_k_dense_replace=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rotary_dim=8,
            num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, moe_intermediate_size=32,
            vocab_size=512, pad_token_id=0, num_codebooks=4, codebook_size=64, image_vocab_size=5010,
            channel_depth=2, channel_heads=4, max_position_embeddings=4096, torch_dtype="float32",
        )
        sizes.update(overrides)
        return cls(**sizes)

    # ---- HF config.json ----
    @classmethod
    def from_hf(cls, path_or_dict: str | Path | dict[str, Any], **overrides: Any) -> LuminaConfig:
        """Read an official `config.json` (a path to the file or its directory, or the parsed dict)."""
        if isinstance(path_or_dict, dict):
            raw = dict(path_or_dict)
        else:
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"{str(path)!r} is not valid JSON: {error}") from error
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"} - set(TRAINING_KEYS)
        kwargs = {k: v for k, v in raw.items() if k in known}
        extra = {k: v for k, v in raw.items() if k not in known}
        kwargs.update(overrides)
        kwargs.setdefault("extra", extra)
        return cls(**kwargs)

    def to_hf(self, **changes: Any) -> dict[str, Any]:
        """The config.json dict: official keys in official order, the hard-coded sizes, lumina's parts, then
        unknown keys."""
        out = {k: getattr(self, k) for k in OFFICIAL_KEYS}
        out.update({k: getattr(self, k) for k in HARD_CODED_KEYS + PART_KEYS})
        out.update(self.extra)
        out.update(changes)
        return json.loads(json.dumps(out))  # deep copy of plain JSON types

    def save_hf(self, directory: str | Path, **changes: Any) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_hf(**changes), indent=2) + "\n")
        return path

    def replace(self, **changes: Any) -> LuminaConfig:
        return dataclasses.replace(self, **changes)
