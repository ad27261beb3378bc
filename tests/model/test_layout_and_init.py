"""State-dict layout (official fused keys), parameter counts, meta-device build + materialisation."""

from __future__ import annotations

import math

import torch
from model_helpers import make_batch

from lumina.model import GroupedExperts, LuminaConfig, LuminaModel
from lumina.model.params import parameter_counts


def official_fused_layout(H: int = 2048, layers: int = 20, nh: int = 16, nkv: int = 4, hd: int = 128,
                          E: int = 256, I_moe: int = 512, I_dense: int = 5120, V: int = 157184, C: int = 8,
                          rows: int = 5010, K: int = 4096, depth: int = 6, heads: int = 8) -> dict[str, tuple]:
    """Contract section 2, written out key by key (fused experts)."""
    keys: dict[str, tuple] = {"model.word_embeddings.weight": (V, H), "model.img_embeddings_proj.weight": (H, C * H),
                              "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for c in range(C):
        keys[f"model.img_embeddings.{c}.weight"] = (rows, H)
        keys[f"lm_img_head.{c}.weight"] = (K, H)
    for i in range(layers):
        p = f"model.layers.{i}."
        keys.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                     p + "attention.query_key_value.weight": ((nh + 2 * nkv) * hd, H),
                     p + "attention.query_layernorm.weight": (hd,), p + "attention.key_layernorm.weight": (hd,),
                     p + "attention.dense.weight": (H, nh * hd)})
        if i == 0:
            keys.update({p + "mlp.gate_proj.weight": (I_dense, H), p + "mlp.up_proj.weight": (I_dense, H),
                         p + "mlp.down_proj.weight": (H, I_dense)})
        else:
            keys.update({p + "mlp.gate.weight": (E, H), p + "mlp.gate.expert_bias": (E,),
                         p + "mlp.shared_experts.gate_proj.weight": (I_moe, H),
                         p + "mlp.shared_experts.up_proj.weight": (I_moe, H),
                         p + "mlp.shared_experts.down_proj.weight": (H, I_moe),
                         p + "mlp.experts.gate_proj": (E, I_moe, H), p + "mlp.experts.up_proj": (E, I_moe, H),
                         p + "mlp.experts.down_proj": (E, H, I_moe)})
    D = H
    m = "multi_codebook_head."
    keys.update({m + "condition_proj.weight": (D, H), m + "condition_proj.bias": (D,),
                 m + "channel_embed": (1, C, D), m + "timesteps_embeddings": (1, C, D), m + "channel_mask": (C, C),
                 m + "channel_norm.weight": (D,), m + "channel_norm.bias": (D,),
                 m + "channel_final.adaLN_modulation.1.weight": (2 * D, D),
                 m + "channel_final.adaLN_modulation.1.bias": (2 * D,)})
    for b in range(depth):
        p = f"{m}channel_blocks.{b}."
        keys.update({p + "norm1.weight": (D,), p + "norm1.bias": (D,), p + "norm2.weight": (D,),
                     p + "norm2.bias": (D,), p + "attn.qkv.weight": (3 * D, D), p + "attn.qkv.bias": (3 * D,),
                     p + "attn.q_norm.weight": (D // heads,), p + "attn.q_norm.bias": (D // heads,),
                     p + "attn.k_norm.weight": (D // heads,), p + "attn.k_norm.bias": (D // heads,),
                     p + "attn.proj.weight": (D, D), p + "attn.proj.bias": (D,),
                     p + "mlp.fc1.weight": (4 * D, D), p + "mlp.fc1.bias": (4 * D,),
                     p + "mlp.fc2.weight": (D, 4 * D), p + "mlp.fc2.bias": (D,),
                     p + "adaLN_modulation.1.weight": (6 * D, D), p + "adaLN_modulation.1.bias": (6 * D,)})
    return keys


def _official_on_meta() -> LuminaModel:
    with torch.device("meta"):
        return LuminaModel(LuminaConfig.official())


def test_official_state_dict_has_exactly_the_official_fused_keys_and_shapes() -> None:
    sd = _official_on_meta().state_dict()
    want = official_fused_layout()
    assert set(sd) - set(want) == set(), "extra keys"
    assert set(want) - set(sd) == set(), "missing keys"
    for key, shape in want.items():
        assert tuple(sd[key].shape) == shape, key
    assert sd["model.layers.1.mlp.gate.expert_bias"].dtype == torch.float32
    assert sd["multi_codebook_head.channel_mask"].dtype == torch.bfloat16


def active_parameters_per_text_token(model_or_config: LuminaModel | LuminaConfig) -> int:
    """Parameters one text token's forward touches: everything except the embedding lookups and the image-side
    modules (`conditional_modules` other than `lm_head`), with routed experts counted at k of E per layer."""
    model = model_or_config
    if isinstance(model, LuminaConfig):
        with torch.device("meta"):
            model = LuminaModel(model)
    skipped = {id(p) for name, module in model.conditional_modules().items() if name != "lm_head"
               for p in module.parameters()}
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in skipped:
                continue
            if isinstance(module, GroupedExperts):
                total += p.numel() // module.num_local_experts * model.config.num_experts_per_tok
            else:
                total += p.numel()
    return total


def test_official_parameter_counts() -> None:
    model = _official_on_meta()
    assert parameter_counts(model).total == 16_904_236_032
    assert active_parameters_per_text_token(model) == 1_111_055_360


def test_active_count_follows_the_module_tree() -> None:
    """On the tiny config, by hand: 3 layers, H=64, nh=4, nkv=2, hd=16, dense I=128, E=8 k=2 I_moe=32, V=512."""
    attention = (4 + 2 * 2) * 16 * 64 + 64 * 64 + 2 * 16
    norms = 2 * 64
    dense = 3 * 128 * 64
    moe = 8 * 64 + 3 * 32 * 64 + 2 * 3 * 32 * 64  # router + shared + 2 of 8 experts
    expected = 3 * (attention + norms) + dense + 2 * moe + 64 + 512 * 64
    assert active_parameters_per_text_token(LuminaConfig.tiny()) == expected


@torch.no_grad()
def test_meta_build_materialises_with_the_official_init() -> None:
    cfg = LuminaConfig.tiny(pad_token_id=3)
    with torch.device("meta"):
        model = LuminaModel(cfg)
    assert model.lm_head.weight.is_meta
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    bb = model.model
    assert torch.count_nonzero(bb.word_embeddings.weight[3]) == 0
    assert abs(float(bb.word_embeddings.weight.std()) - 0.02) < 0.002
    assert abs(float(model.lm_head.weight.std()) - 0.02) < 0.002
    moe = bb.layers[1].mlp
    assert abs(float(moe.experts.gate_proj.std()) - 0.02) < 0.002
    bound = 1 / math.sqrt(cfg.hidden_size)  # kaiming_uniform(a=sqrt(5)) on fan_in H
    assert float(moe.gate.weight.abs().max()) <= bound and float(moe.gate.weight.std()) > bound / 3
    assert torch.equal(moe.gate.expert_bias, torch.zeros(cfg.num_experts))
    assert torch.equal(bb.norm.weight, torch.ones(cfg.hidden_size))
    head = model.multi_codebook_head
    block = head.channel_blocks[0]
    assert torch.equal(block.norm1.weight, torch.ones(64)) and torch.equal(block.norm1.bias, torch.zeros(64))
    assert torch.count_nonzero(block.attn.qkv.bias) == 0
    assert torch.equal(head.channel_mask.float(), torch.zeros(4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(),
                                                                                 float("-inf")))
    inv = bb.rotary_emb.inv_freq
    assert math.isclose(float(inv[1]), cfg.rope_theta ** (-2 / cfg.rotary_dims), rel_tol=1e-6)
    out = model(make_batch([1, 2, 3, 4, 4]))
    assert out.hidden.isfinite().all()


@torch.no_grad()
def test_init_weights_rewrites_every_tensor_of_a_meta_built_model() -> None:
    """reset_parameters() everywhere: after to_empty, garbage in any parameter or buffer (persistent or not)
    would survive init_weights() in a module without one."""
    with torch.device("meta"):
        model = LuminaModel(LuminaConfig.tiny())
    model.to_empty(device="cpu")
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    for t in tensors.values():
        t.fill_(float("nan") if t.is_floating_point() else -7)
    model.init_weights()
    left = [name for name, t in tensors.items() if (t.isnan() if t.is_floating_point() else t == -7).any()]
    assert left == []
    assert "model.rotary_emb.inv_freq" in tensors and "model.layers.1.mlp.gate.expert_bias" in tensors
