"""Helpers for the checkpoint tests: an independent key list written from the contract (section 2), seeded
tiny models with non-trivial buffers, a naive safetensors directory reader, and a small packed batch."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaConfig, LuminaModel


def contract_keys(cfg: LuminaConfig, layout: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of `LLaDA2MoeModelLM`, transcribed table by table from the contract's section 2."""
    H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    E, I_moe, I_dense, V = cfg.num_experts, cfg.moe_intermediate_size, cfg.intermediate_size, cfg.vocab_size
    C, rows, K = cfg.num_codebooks, cfg.image_vocab_size, cfg.codebook_size
    D, heads, depth = H, cfg.channel_heads, cfg.channel_depth
    out = {}
    # backbone
    out["model.word_embeddings.weight"] = (V, H)
    for c in range(C):
        out[f"model.img_embeddings.{c}.weight"] = (rows, H)
    out["model.img_embeddings_proj.weight"] = (H, C * H)
    for i in range(cfg.num_hidden_layers):
        L = f"model.layers.{i}"
        out[f"{L}.input_layernorm.weight"] = (H,)
        out[f"{L}.post_attention_layernorm.weight"] = (H,)
        out[f"{L}.attention.query_key_value.weight"] = ((nh + 2 * nkv) * hd, H)
        out[f"{L}.attention.query_layernorm.weight"] = (hd,)
        out[f"{L}.attention.key_layernorm.weight"] = (hd,)
        out[f"{L}.attention.dense.weight"] = (H, nh * hd)
        if i < cfg.first_k_dense_replace:
            out[f"{L}.mlp.gate_proj.weight"] = (I_dense, H)
            out[f"{L}.mlp.up_proj.weight"] = (I_dense, H)
            out[f"{L}.mlp.down_proj.weight"] = (H, I_dense)
            continue
        out[f"{L}.mlp.gate.weight"] = (E, H)
        out[f"{L}.mlp.gate.expert_bias"] = (E,)
        out[f"{L}.mlp.shared_experts.gate_proj.weight"] = (I_moe, H)
        out[f"{L}.mlp.shared_experts.up_proj.weight"] = (I_moe, H)
        out[f"{L}.mlp.shared_experts.down_proj.weight"] = (H, I_moe)
        if layout == "split":
            for e in range(E):
                out[f"{L}.mlp.experts.{e}.gate_proj.weight"] = (I_moe, H)
                out[f"{L}.mlp.experts.{e}.up_proj.weight"] = (I_moe, H)
                out[f"{L}.mlp.experts.{e}.down_proj.weight"] = (H, I_moe)
        else:
            out[f"{L}.mlp.experts.gate_proj"] = (E, I_moe, H)
            out[f"{L}.mlp.experts.up_proj"] = (E, I_moe, H)
            out[f"{L}.mlp.experts.down_proj"] = (E, H, I_moe)
    out["model.norm.weight"] = (H,)
    # heads
    out["lm_head.weight"] = (V, H)
    for c in range(C):
        out[f"lm_img_head.{c}.weight"] = (K, H)
    m = "multi_codebook_head"
    out[f"{m}.condition_proj.weight"], out[f"{m}.condition_proj.bias"] = (D, H), (D,)
    out[f"{m}.channel_embed"] = (1, C, D)
    out[f"{m}.timesteps_embeddings"] = (1, C, D)
    out[f"{m}.channel_mask"] = (C, C)
    out[f"{m}.channel_norm.weight"], out[f"{m}.channel_norm.bias"] = (D,), (D,)
    out[f"{m}.channel_final.adaLN_modulation.1.weight"] = (2 * D, D)
    out[f"{m}.channel_final.adaLN_modulation.1.bias"] = (2 * D,)
    for b in range(depth):
        B = f"{m}.channel_blocks.{b}"
        for norm in ("norm1", "norm2"):
            out[f"{B}.{norm}.weight"], out[f"{B}.{norm}.bias"] = (D,), (D,)
        out[f"{B}.attn.qkv.weight"], out[f"{B}.attn.qkv.bias"] = (3 * D, D), (3 * D,)
        for norm in ("q_norm", "k_norm"):
            out[f"{B}.attn.{norm}.weight"], out[f"{B}.attn.{norm}.bias"] = (D // heads,), (D // heads,)
        out[f"{B}.attn.proj.weight"], out[f"{B}.attn.proj.bias"] = (D, D), (D,)
        out[f"{B}.mlp.fc1.weight"], out[f"{B}.mlp.fc1.bias"] = (4 * D, D), (4 * D,)
        out[f"{B}.mlp.fc2.weight"], out[f"{B}.mlp.fc2.bias"] = (D, 4 * D), (D,)
        out[f"{B}.adaLN_modulation.1.weight"], out[f"{B}.adaLN_modulation.1.bias"] = (6 * D, D), (6 * D,)
    return out


def seeded_model(config: LuminaConfig, seed: int = 0, dtype: torch.dtype | None = None) -> LuminaModel:
    """A tiny model whose every persistent tensor is random (expert_bias too), optionally cast to `dtype`
    (expert_bias stays fp32, channel_mask bf16, as in the official model)."""
    torch.manual_seed(seed)
    model = LuminaModel(config)
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if key.endswith("expert_bias"):
                tensor.copy_(torch.randn_like(tensor) * 0.1)
    if dtype is not None:
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return model


def read_dir(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `directory` (naive reference reader; keys must be unique)."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        part = load_file(path)
        assert not set(part) & set(out), f"duplicate keys across shards: {set(part) & set(out)}"
        out.update(part)
    return out


_SPLIT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(\w+_proj)\.weight$")


def naive_fuse(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Reference split -> fused: stack `experts.{e}.{proj}.weight` over e into `experts.{proj}`."""
    out, groups = {}, {}
    for key, tensor in tensors.items():
        match = _SPLIT.match(key)
        if match is None:
            out[key] = tensor
        else:
            groups.setdefault(f"{match.group(1)}.{match.group(3)}", {})[int(match.group(2))] = tensor
    for key, parts in groups.items():
        out[key] = torch.stack([parts[e] for e in range(len(parts))])
    return out


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b), f"only in first: {sorted(set(a) - set(b))[:5]}, only in second: {sorted(set(b) - set(a))[:5]}"
    for key in a:
        x, y = a[key].detach().cpu(), b[key].detach().cpu()
        assert x.dtype == y.dtype, f"{key}: {x.dtype} vs {y.dtype}"
        assert x.shape == y.shape, f"{key}: {list(x.shape)} vs {list(y.shape)}"
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), f"{key} differs"


def small_batch(config: LuminaConfig, seed: int = 0) -> PackedBatch:
    """One clean segment with text prompt (1), media prompt (2), text answer (3) and image answer (4) rows,
    labelled so the forward exercises the text head and the channel head."""
    types = torch.tensor([1, 1, 2, 2, 1, 3, 3, 3, 1, 4, 4, 4, 3])
    g = torch.Generator().manual_seed(seed)
    seq, C = types.numel(), config.num_codebooks
    text = torch.randint(1, config.vocab_size, (seq, 1), generator=g).expand(seq, C)
    codes = torch.randint(0, config.codebook_size, (seq, C), generator=g)
    is_image = (types == 2) | (types == 4)
    labels = torch.full((seq, C), -100)
    labels[types == 3, 0] = torch.randint(0, config.vocab_size, (int((types == 3).sum()),), generator=g)
    labels[types == 4] = torch.randint(0, config.codebook_size, (int((types == 4).sum()), C), generator=g)
    return PackedBatch(
        input_ids=torch.where(is_image[:, None], codes, text).clone(), type_ids=types,
        turn_ids=torch.zeros(seq, dtype=torch.long), block_ids=torch.full((seq,), -1),
        position_ids=torch.arange(seq), is_clean=torch.ones(seq, dtype=torch.bool),
        token_valid=torch.ones(seq, dtype=torch.bool), cu_seqlens=torch.tensor([0, seq], dtype=torch.int32),
        labels=labels)
