"""Official state-dict names and shapes (contract section 2) and the expert-key grammar of both layouts.

Split layout (`llada2_moe`, what the official loader accepts):
    model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight   [I, H]
    model.layers.{i}.mlp.experts.{e}.down_proj.weight        [H, I]
Fused layout (`llada2_moe_veomni`, `LuminaModel.state_dict()`; slice e is expert e's split weight):
    model.layers.{i}.mlp.experts.{gate,up}_proj              [E, I, H]
    model.layers.{i}.mlp.experts.down_proj                   [E, H, I]
"""

from __future__ import annotations

import re

import torch

from lumina.model.config import LuminaConfig
from lumina.model.image_heads import IMAGE_HEADS, image_head_class
from lumina.model.routers import ROUTERS

EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
LAYOUTS = ("split", "fused")
MODEL_TYPE_OF_LAYOUT = {"split": "llada2_moe", "fused": "llada2_moe_veomni"}

_GATE_BUFFER_RE = re.compile(r"^model\.layers\.\d+\.mlp\.gate\.(\w+)$")
_SPLIT_RE = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_RE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_proj|up_proj|down_proj)$")


def split_expert_key(fused_key: str, expert: int) -> str:
    """`model.layers.3.mlp.experts.up_proj`, 5 -> `model.layers.3.mlp.experts.5.up_proj.weight`."""
    if not is_fused_expert_key(fused_key):
        raise ValueError(f"fused_key={fused_key!r} is not a fused expert key (model.layers.{{i}}.mlp.experts.<proj>)")
    prefix, proj = fused_key.rsplit(".", 1)
    return f"{prefix}.{expert}.{proj}.weight"


def parse_split_expert_key(key: str) -> tuple[str, int] | None:
    """`...experts.5.up_proj.weight` -> (`...experts.up_proj`, 5); None for any other key (also `experts.05`)."""
    match = _SPLIT_RE.match(key)
    if match is None or str(int(match.group(2))) != match.group(2):
        return None
    return f"{match.group(1)}.{match.group(3)}", int(match.group(2))


def is_fused_expert_key(key: str) -> bool:
    return _FUSED_RE.match(key) is not None


def expert_group(key: str) -> str | None:
    """The experts module a fused or split expert key belongs to (`model.layers.{i}.mlp.experts`), else None."""
    parsed = parse_split_expert_key(key)
    if parsed is not None:
        key = parsed[0]
    return key.rsplit(".", 1)[0] if is_fused_expert_key(key) else None


def official_buffer_dtype(key: str) -> torch.dtype | None:
    """The fixed dtype of a persistent buffer (a router's `BUFFER_DTYPES`, an image head's `buffer_dtypes`);
    None for parameters."""
    gate = _GATE_BUFFER_RE.match(key)
    if gate is not None:
        return _router_buffer_dtypes().get(gate.group(1))
    prefix, _, rest = key.partition(".")
    for name in IMAGE_HEADS.names():
        head = IMAGE_HEADS.get(name, "image_head")
        if head.module_name == prefix and rest in head.buffer_dtypes:
            return head.buffer_dtypes[rest]
    return None


def official_shapes(config: LuminaConfig, layout: str = "fused") -> dict[str, tuple[int, ...]]:
    """Every key of the official `LLaDA2MoeModelLM` state dict for `config` -> its shape, in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {LAYOUTS}")
    c = config
    router = ROUTERS.get(c.score_function, "LuminaConfig.score_function")
    h, n_cb = c.hidden_size, c.num_codebooks
    qkv_rows = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.word_embeddings.weight": (c.vocab_size, h)}
    for cb in range(n_cb):
        shapes[f"model.img_embeddings.{cb}.weight"] = (c.image_vocab_size, h)
    shapes["model.img_embeddings_proj.weight"] = (h, n_cb * h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "attention.query_key_value.weight"] = (qkv_rows, h)
        shapes[p + "attention.query_layernorm.weight"] = (c.head_dim,)
        shapes[p + "attention.key_layernorm.weight"] = (c.head_dim,)
        shapes[p + "attention.dense.weight"] = (h, c.num_attention_heads * c.head_dim)
        if not c.is_moe_layer(i):
            shapes.update(_swiglu_shapes(p + "mlp.", h, c.intermediate_size))
        else:
            shapes[p + "mlp.gate.weight"] = (c.num_experts, h)
            shapes.update({f"{p}mlp.gate.{name}": (c.num_experts,) for name in router.BUFFER_DTYPES})
            fused = {"gate_proj": (c.num_experts, c.moe_intermediate_size, h),
                     "up_proj": (c.num_experts, c.moe_intermediate_size, h),
                     "down_proj": (c.num_experts, h, c.moe_intermediate_size)}
            if layout == "fused":
                shapes.update({f"{p}mlp.experts.{proj}": shape for proj, shape in fused.items()})
            else:
                for e in range(c.num_experts):
                    shapes.update({f"{p}mlp.experts.{e}.{proj}.weight": shape[1:] for proj, shape in fused.items()})
            if c.num_shared_experts is not None:
                shapes.update(_swiglu_shapes(p + "mlp.shared_experts.", h, c.shared_expert_size))
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (c.vocab_size, h)
    for cb in range(n_cb):
        shapes[f"lm_img_head.{cb}.weight"] = (c.codebook_size, h)
    head = image_head_class(c)
    shapes.update({f"{head.module_name}.{key}": shape for key, shape in head.state_shapes(c).items()})
    return shapes


def _router_buffer_dtypes() -> dict[str, torch.dtype]:
    """Buffer name -> fixed dtype over every registered router (`MoERouter.BUFFER_DTYPES`)."""
    return {name: dtype for part in ROUTERS.names()
            for name, dtype in ROUTERS.get(part, "score_function").BUFFER_DTYPES.items()}


def _swiglu_shapes(prefix: str, hidden: int, width: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (width, hidden), prefix + "up_proj.weight": (width, hidden),
            prefix + "down_proj.weight": (hidden, width)}
