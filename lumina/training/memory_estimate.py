"""`estimate_step_memory`: the memory one training step needs, from a `LuminaConfig` and a sequence length,
without building anything (`lumina-train estimate_memory=true [memory_budget_gib=20]`).

Parts (bytes per rank): parameters (of the model built on meta); gradients and AdamW's two optimizer_states
per trainable parameter (`mark_trainable`), in the parameter dtype; activations (what autograd keeps for
backward under the checkpointing policy, plus one recompute); head_losses (`head_loss_bytes`,
`head_weight_gradient_bytes`); optimizer_step (AdamW's foreach temporaries); fsdp_buffers (two unsharded units
and one unit's unreduced gradient).
    peak = parameters + gradients + optimizer_states + fsdp_buffers + max(activations + head_losses,
           optimizer_step), every gradient counted as live at the activation peak (an upper bound)
    step_rise = gradients + activations + head_losses (what experiments/bench/step_memory.py measures)

Policies (`LuminaConfig.gradient_checkpointing`): none keeps every layer's activations; full each layer's
input [S, H] and routing tape (top-k ids); selective the attention blocks and each FFN sub-block's input and
tape. Under full / selective one recomputed unit holds its activations and as many bytes of their gradients
("recompute" counts it twice), and the channel head is checkpointed in `CHANNEL_CHECKPOINT_ROWS`-row chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumina.adapters import Adapter
from lumina.model.activation_checkpointing import CHANNEL_CHECKPOINT_ROWS
from lumina.model.config import LuminaConfig, checkpoint_policy
from lumina.model.dtypes import float_dtype, float_dtype_of_size
from lumina.model.experts import experts_per_rank
from lumina.model.image_heads import ImageHead, build_image_head, image_head_class
from lumina.model.linear_ce import auto_chunk_rows
from lumina.model.lumina_model import LuminaModel
from lumina.model.params import parameter_counts
from lumina.model.supervision import PackRows, int_at_least
from lumina.training.trainable import mark_trainable

FP32, INT64 = 4, 8
_CHANNEL_HEAD_BYTES: dict[tuple[str, int], int] = {}  # by (repr(config), activation bytes)
GIB = 2**30
OPTIMIZERS = {"adamw": 2, "sgd": 0}  # states per parameter
PACK_KEYS = ("text_rows", "image_rows", "image_input_rows", "segment_len")  # conf/train.yaml's memory_pack


@dataclass(frozen=True)
class Precision:
    """Bytes per element: parameters (gradients, AdamW states), activations, FSDP's unsharded parameters."""

    param_bytes: int = FP32
    activation_bytes: int = FP32
    gathered_bytes: int = FP32

    @classmethod
    def of(cls, trainer_precision: object = "32-true", param_dtype: str | None = None) -> Precision:
        """From Lightning's `trainer.precision` and FSDP's `parallel.param_dtype` (bf16 compute, fp32 master)."""
        text = str(trainer_precision)
        half = text.startswith(("bf16", "16"))
        if not (half or text.startswith("32") or text.startswith("64")):
            raise ValueError(f"trainer.precision={trainer_precision!r}: not a precision the estimate knows")
        wide = 8 if text.startswith("64") else FP32
        params = 2 if half and text.endswith("-true") else wide
        gathered = 2 if param_dtype and float_dtype("param_dtype", param_dtype).itemsize == 2 else params
        activations = 2 if half or gathered == 2 else wide
        return cls(params, activations, gathered)

    @property
    def name(self) -> str:
        return f"{8 * self.param_bytes}-bit parameters, {8 * self.activation_bytes}-bit activations"


def _rmsnorm_saved(width: int, a: int) -> int:
    """RMSNorm of a [.., width] input: fp32 input (the input itself in fp32), rsqrt, normalised in a."""
    return width * FP32 + FP32 + width * a


def attention_bytes(config: LuminaConfig, a: int) -> int:
    """Per token: the attention sub-block of a layer, from its input RMSNorm to the dense projection's input."""
    h, hd, nh, nkv = config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads
    norm = _rmsnorm_saved(h, a) + h * a  # + its output, the QKV projection's input
    qkv = (nh + 2 * nkv) * hd * a  # kept by the q / k RMSNorms (views of it)
    qk_norms = (nh + nkv) * (hd * a + FP32) + (0 if a == FP32 else (nh + nkv) * hd * FP32)
    rotated = (nh + nkv) * hd * a
    v_copy = nkv * hd * a
    sdpa = nh * hd * a + nh * FP32  # output + log-sum-exp
    dense_input = nh * hd * a
    return norm + qkv + qk_norms + rotated + v_copy + sdpa + dense_input


def router_bytes(config: LuminaConfig) -> int:
    """Per token: the router's k selected fp32 scores, their int64 ids and the normalisation's sum."""
    k = config.num_experts_per_tok
    return k * FP32 + k * INT64 + FP32


def ffn_bytes(config: LuminaConfig, layer_idx: int, a: int) -> int:
    """Per token: the FFN sub-block of layer `layer_idx` (post-attention RMSNorm -> MoE or dense SwiGLU)."""
    norm = _rmsnorm_saved(config.hidden_size, a) + config.hidden_size * a
    if not config.is_moe_layer(layer_idx):
        return norm + 4 * config.intermediate_size * a
    k = config.num_experts_per_tok
    experts = k * FP32 + k * INT64 + 2 * k * config.moe_intermediate_size * a
    return norm + router_bytes(config) + experts + 4 * config.shared_expert_size * a


def tape_bytes(config: LuminaConfig, layer_idx: int) -> int:
    """Per token: the routing tape a checkpointed MoE layer keeps (top-k ids, int64)."""
    return config.num_experts_per_tok * INT64 if config.is_moe_layer(layer_idx) else 0


def backbone_bytes(config: LuminaConfig, policy: str, a: int) -> tuple[int, int]:
    """Per token: (what the layers, final RMSNorm and cos/sin keep under `policy`; what the largest recompute
    unit rebuilds in backward, 0 for none)."""
    layers = range(config.num_hidden_layers)
    attn, kept_input = attention_bytes(config, a), config.hidden_size * a
    if policy == "none":
        kept, recompute = sum(attn + ffn_bytes(config, i, a) for i in layers), 0
    elif policy == "selective":
        kept = sum(attn + kept_input + tape_bytes(config, i) for i in layers)
        recompute = max(ffn_bytes(config, i, a) for i in layers)
    else:
        kept = sum(kept_input + tape_bytes(config, i) for i in layers)
        recompute = max(attn + ffn_bytes(config, i, a) for i in layers)
    return kept + _rmsnorm_saved(config.hidden_size, a) + 2 * config.rotary_dims * a, recompute


def _saved_bytes(head: ImageHead, width: int, rows: int, dtype: torch.dtype) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in `head`'s forward on [rows, width]."""
    device = next(head.parameters()).device
    h = torch.empty(rows, width, dtype=dtype, device=device, requires_grad=True)
    forced = rows if head.teacher_forced else 0
    prefix = torch.empty(forced, head.num_codebooks - 1, width, dtype=dtype, device=device, requires_grad=True)
    # a storage's identity is its `_cdata` (meta storages all have data_ptr 0)
    own = {t.untyped_storage()._cdata for t in (*head.parameters(), *head.buffers())}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in own:
            saved[storage._cdata] = storage.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        head(h, prefix)
    return sum(saved.values())


def channel_head_bytes_per_row(config: LuminaConfig, a: int) -> int:
    """Per supervised image row: what the image head keeps for backward, measured on meta (cached)."""
    key = (repr(config), a)
    if key not in _CHANNEL_HEAD_BYTES:
        dtype = float_dtype_of_size(a)
        with torch.device("meta"):
            head = build_image_head(config).to(dtype)
        saved = [_saved_bytes(head, config.hidden_size, rows, dtype) for rows in (4, 2)]
        _CHANNEL_HEAD_BYTES[key] = (saved[0] - saved[1]) // 2
    return _CHANNEL_HEAD_BYTES[key]


def channel_head_bytes(config: LuminaConfig, policy: str, image_rows: int, a: int) -> int:
    """The channel head over `image_rows` rows: all activations under none; else each chunk's input plus one
    recomputed chunk's activations and their gradients."""
    per_row = channel_head_bytes_per_row(config, a)
    if policy == "none":
        return image_rows * per_row
    return image_rows * config.hidden_size * a + 2 * min(CHANNEL_CHECKPOINT_ROWS, image_rows) * per_row


def embedding_bytes(config: LuminaConfig, seq_len: int, rows: PackRows, a: int) -> int:
    """The embeddings' saved tensors: ids and the stacked code embeddings of image inputs and forced codes."""
    coded = rows.image_inputs + (rows.image if image_head_class(config).teacher_forced else 0)
    return seq_len * INT64 + coded * config.num_codebooks * (config.hidden_size * a + INT64)


def mask_bytes(backend: str, seq_len: int, rows: PackRows, a: int) -> int:
    """The additive attention masks a pack's spec caches (segmented: sum L_i^2; sdpa_dense: S^2)."""
    if backend == "sdpa_dense":
        return seq_len * seq_len * a
    if backend == "segmented":
        return seq_len * rows.segment_len * a
    return 0


HEAD_MODULES = ("lm_head.", "lm_img_head.")  # the heads whose fused losses form weight gradients in forward


def head_weight_gradient_bytes(heads: int, precision: Precision, shard: int) -> int:
    """The weight gradients of the `heads` trainable head parameters, which the fused losses form in forward
    (a frozen head forms none): on one rank only the fp32 accumulator of narrower weights (the rest are the
    parameters' gradients); under FSDP the unsharded weights' in full."""
    if shard == 1:
        return heads * FP32 if precision.param_bytes < FP32 else 0
    return heads * (precision.gathered_bytes + (FP32 if precision.gathered_bytes < FP32 else 0))


def head_loss_bytes(config: LuminaConfig, seq_len: int, rows: PackRows, a: int) -> int:
    """The fused head losses' activations: hidden states and head inputs, input-gradient buffers (text
    [Nt, H], image C x [Ni, H]) and the largest fp32 logits chunk."""
    h, c = config.hidden_size, config.num_codebooks
    inputs = (seq_len + rows.text + c * rows.image) * h * a
    grad_inputs = (rows.text + c * rows.image) * h * a
    text_rows = min(config.loss_chunk_rows or auto_chunk_rows(config.vocab_size), rows.text)
    image_rows = min(config.loss_chunk_rows or auto_chunk_rows(config.codebook_size), rows.image)
    chunk = max(text_rows * config.vocab_size, image_rows * config.codebook_size) * FP32
    return inputs + grad_inputs + chunk


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank of one training step; see the module docstring for each part."""

    seq_len: int
    policy: str
    rows: PackRows
    precision: Precision
    parameter_count: int
    trainable_count: int
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    head_losses: int
    optimizer_step: int
    fsdp_buffers: int = 0
    shard: int = 1
    ep: int = 1
    activation_parts: tuple[tuple[str, int], ...] = ()
    sp: int = 1  # sequence-parallel size: seq_len is then this rank's share of the pack

    @property
    def peak(self) -> int:
        persistent = self.parameters + self.gradients + self.optimizer_states + self.fsdp_buffers
        return persistent + max(self.activations + self.head_losses, self.optimizer_step)

    @property
    def step_rise(self) -> int:
        return self.gradients + self.activations + self.head_losses

    @property
    def activation_bytes_per_token(self) -> float:
        return self.activations / self.seq_len

    def fits(self, budget_gib: float) -> bool:
        return self.peak <= budget_gib * GIB

    def table(self, budget_gib: float | None = None) -> str:
        """A small text table of the parts (GiB), the peak and, with a budget, the fit verdict."""
        ranks = "1 rank" if self.shard == 1 else f"FSDP shard {self.shard}, ep {self.ep}"
        length = f"seq_len {self.seq_len}" if self.sp == 1 else f"{self.seq_len} rows per rank (sp {self.sp})"
        lines = [f"memory estimate: {length}, gradient_checkpointing={self.policy}, "
                 f"{self.precision.name}, {ranks}",
                 f"  {'part':<18} {'GiB':>9}  notes"]

        def row(name: str, value: int, note: str = "") -> None:
            lines.append(f"  {name:<18} {value / GIB:9.3f}  {note}".rstrip())

        row("parameters", self.parameters, f"{self.parameter_count / 1e6:.1f}M parameters")
        row("gradients", self.gradients, f"{self.trainable_count / 1e6:.1f}M trainable parameters")
        row("optimizer states", self.optimizer_states)
        if self.fsdp_buffers:
            row("fsdp buffers", self.fsdp_buffers, "two unsharded units + one unreduced gradient")
        parts = ", ".join(f"{name} {value / GIB:.2f}" for name, value in self.activation_parts)
        row("activations", self.activations,
            f"{self.activation_bytes_per_token / 1024:.1f} KiB per token ({parts})")
        row("head losses", self.head_losses,
            f"rows: text {self.rows.text}, image {self.rows.image} (image inputs {self.rows.image_inputs})")
        row("optimizer step", self.optimizer_step, "after backward; the larger of it and activations counts")
        row("peak", self.peak)
        if budget_gib is not None:
            lines.append(f"fits in {budget_gib:g} GiB: {'yes' if self.fits(budget_gib) else 'no'}")
        return "\n".join(lines)


def estimate_step_memory(config: LuminaConfig, seq_len: int, policy: str | bool | None = None,
                         rows: PackRows | None = None, precision: Precision | None = None,
                         optimizer: str = "adamw", shard: int = 1, ep: int = 1,
                         attn_backend: str | None = None, freeze: Sequence[str] = (),
                         adapter: Adapter | None = None) -> MemoryEstimate:
    """The memory of one step of `config` on packs of `seq_len` tokens (B = 1) on one rank.

    policy: None = config.gradient_checkpointing; rows: None = `PackRows.assume(seq_len)`; optimizer: "adamw"
    or "sgd"; shard: FSDP shard size (experts split over ep, sharded over shard // ep); attn_backend: None =
    config.attn_backend; freeze: `model.freeze` globs (no gradient, no optimizer state); adapter: applied to
    the meta model first (its parameters counted; with a frozen base only they get gradients and states)."""
    from lumina.attention import resolve_backend

    int_at_least("seq_len", seq_len, 1)
    policy = checkpoint_policy(config.gradient_checkpointing if policy is None else policy, "policy")
    rows = rows or PackRows.assume(seq_len)
    precision = precision or Precision()
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: must be one of {tuple(OPTIMIZERS)}")
    int_at_least("shard", shard, 1)
    int_at_least("ep", ep, 1)
    if shard % ep:
        raise ValueError(f"ep={ep}: must divide shard={shard}")
    experts_per_rank(config.num_experts, ep)
    backend = resolve_backend(attn_backend or config.attn_backend)
    if rows.positions != seq_len:
        raise ValueError(f"rows.positions={rows.positions}: the pack's rows must number seq_len={seq_len}")

    a = precision.activation_bytes
    with torch.device("meta"):
        model = LuminaModel(config)
    adapter_params = adapter.apply(model) if adapter is not None else []
    counts = parameter_counts(model)
    only = adapter.trainable(model, adapter_params) if adapter is not None else None
    trainable_params = mark_trainable(model, freeze, only)
    trainable = sum(p.numel() for p in trainable_params.values())
    heads = sum(p.numel() for name, p in trainable_params.items() if name.startswith(HEAD_MODULES))
    per_rank = -(-counts.total // shard)
    param_bytes = per_rank * precision.param_bytes
    grad_bytes = -(-trainable // shard) * precision.param_bytes
    kept, recompute = backbone_bytes(config, policy, a)
    parts = (("backbone", seq_len * kept), ("recompute", 2 * seq_len * recompute),
             ("channel head", channel_head_bytes(config, policy, rows.image, a)),
             ("embeddings", embedding_bytes(config, seq_len, rows, a)),
             ("masks", mask_bytes(backend, seq_len, rows, a)))
    states = OPTIMIZERS[optimizer]
    fsdp = 0
    if shard > 1:  # the largest FSDP unit while unsharded: a layer's experts stay split over ep
        largest = max(dense + experts // ep for dense, experts in counts.units.values())
        fsdp = largest * (2 * precision.gathered_bytes + FP32)
    return MemoryEstimate(
        seq_len=seq_len, policy=policy, rows=rows, precision=precision, parameter_count=counts.total,
        trainable_count=trainable,
        parameters=param_bytes, gradients=grad_bytes, optimizer_states=states * grad_bytes,
        activations=sum(value for _, value in parts),
        head_losses=head_loss_bytes(config, seq_len, rows, a) + head_weight_gradient_bytes(heads, precision, shard),
        optimizer_step=grad_bytes if states else 0, fsdp_buffers=fsdp, shard=shard, ep=ep,
        activation_parts=parts)
