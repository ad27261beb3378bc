"""One test per numeric quirk of the backbone (norms, rotary, attention, embeddings), each written from the
contract's text; each fails if the quirk is dropped."""

from __future__ import annotations

import math

import torch
from lumina_reference import attention as reference_attention
from model_helpers import make_batch

from lumina.attention import build_spec
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.attention import Attention
from lumina.model.layers import RMSNorm
from lumina.model.rotary import RotaryEmbedding, apply_rotary


def test_rmsnorm_normalises_in_fp32_and_casts_back_before_the_weight() -> None:
    torch.manual_seed(0)
    x = (torch.randn(64, 256) * 3).bfloat16()
    norm = RMSNorm(256, eps=1e-6).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(256) * 2 + 1)
    wide = x.float()
    official = norm.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    weight_first = (norm.weight.float() * wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    got = norm(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, official)
    assert not torch.equal(got, weight_first)  # the order is observable: this test can fail


def test_rotary_inverse_frequencies_of_the_official_config() -> None:
    rope = RotaryEmbedding(rotary_dim=64, theta=600000.0)
    assert rope.inv_freq.shape == (32,)
    for j in (0, 1, 17, 31):
        assert math.isclose(float(rope.inv_freq[j]), 600000.0 ** (-2 * j / 64), rel_tol=1e-6)
    assert "inv_freq" not in rope.state_dict()  # non-persistent


def test_rotary_pairs_dim_i_with_i_plus_half_over_the_first_rotary_dims_only() -> None:
    head_dim, rotary_dim, theta, position = 16, 8, 10000.0, 5
    rope = RotaryEmbedding(rotary_dim, theta)
    cos, sin = rope(torch.tensor([[position]]), torch.float64)
    for i in range(rotary_dim // 2):
        x = torch.zeros(1, 1, 1, head_dim, dtype=torch.float64)
        x[..., i] = 1.0
        x[..., rotary_dim + i] = 7.0  # a non-rotated dim
        out = apply_rotary(x, cos, sin)[0, 0, 0]
        angle = position * theta ** (-2 * i / rotary_dim)
        expected = torch.zeros(head_dim, dtype=torch.float64)
        expected[i] = math.cos(angle)
        expected[i + rotary_dim // 2] = math.sin(angle)
        expected[rotary_dim + i] = 7.0
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_rotary_cos_sin_are_computed_in_fp32_then_cast() -> None:
    rope = RotaryEmbedding(rotary_dim=64, theta=600000.0)
    positions = torch.arange(3000, 3064).view(1, -1)
    cos, sin = rope(positions, torch.bfloat16)
    angles32 = positions.float()[..., None] * rope.inv_freq.float()
    angles32 = torch.cat([angles32, angles32], dim=-1)
    assert cos.dtype == torch.bfloat16
    assert torch.equal(cos, angles32.cos().bfloat16()) and torch.equal(sin, angles32.sin().bfloat16())
    angles16 = positions.bfloat16()[..., None] * rope.inv_freq.bfloat16()
    angles16 = torch.cat([angles16, angles16], dim=-1)
    assert not torch.equal(cos, angles16.cos())  # computing in bf16 would be visibly different


def _bidirectional_spec(seq: int) -> object:
    return build_spec(make_batch([1] * seq, labelled=False))


def test_attention_qkv_order_qk_norm_partial_rope_gqa_and_scale_match_the_contract() -> None:
    """Q rows head-major then K then V; one [hd] RMSNorm weight per q/k shared by heads, before partial RoPE;
    kv head j serves query heads j*g..j*g+g-1; SDPA scale 1/sqrt(hd); non-causal."""
    cfg = LuminaConfig.tiny(num_attention_heads=6, num_key_value_heads=2)  # g = 3: a wrong head map shows
    torch.manual_seed(0)
    attn = Attention(cfg).double()
    with torch.no_grad():
        attn.query_layernorm.weight.copy_(torch.rand(cfg.head_dim) + 0.5)
        attn.key_layernorm.weight.copy_(torch.rand(cfg.head_dim) + 0.5)
        attn.query_key_value.weight.mul_(10)  # sharper attention: a wrong scale or mask shows
    seq = 9
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.float64)
    positions = [3 * s + 1 for s in range(seq)]
    cos, sin = RotaryEmbedding(cfg.rotary_dims, cfg.rope_theta)(torch.tensor([positions]), torch.float64)
    got = attn(x, cos, sin, _bidirectional_spec(seq))[0]
    sd = {"a." + k: v for k, v in attn.state_dict().items()}
    want = reference_attention(x[0], sd, "a.", cfg, positions)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_embedding_routes_rows_by_type_without_scale() -> None:
    """Types 2/4 concatenate the C code embeddings (codebook 0 first) and project; others use word_embeddings
    of column 0."""
    cfg = LuminaConfig.tiny()
    torch.manual_seed(0)
    model = LuminaModel(cfg)
    batch = make_batch([1, 2, 3, 4, 0, 4, 2], seed=5)
    text = torch.tensor([0, 2, 4])
    batch.input_ids[0, text, 1:] = torch.tensor([11, 22, 33])  # only column 0 of a text row may count
    embeds, _ = model.model.embed(batch.input_ids, batch.type_ids)
    ids = batch.input_ids[0]
    bb = model.model
    for s, t in enumerate(batch.type_ids[0].tolist()):
        if t in (2, 4):
            cat = torch.cat([bb.img_embeddings[c].weight[ids[s, c]] for c in range(cfg.num_codebooks)])
            want = bb.img_embeddings_proj.weight @ cat
        else:
            want = bb.word_embeddings.weight[ids[s, 0]]
        torch.testing.assert_close(embeds[0, s], want, rtol=1e-5, atol=1e-6)


def test_word_embedding_padding_row_is_zero_and_fixed() -> None:
    cfg = LuminaConfig.tiny(pad_token_id=7)
    model = LuminaModel(cfg)
    assert model.model.word_embeddings.padding_idx == 7
    assert torch.count_nonzero(model.model.word_embeddings.weight[7]) == 0
    assert torch.count_nonzero(model.model.word_embeddings.weight[6]) > 0


def test_first_k_dense_layers_use_intermediate_size_and_the_rest_are_moe() -> None:
    cfg = LuminaConfig.tiny(num_hidden_layers=4, first_k_dense_replace=2, intermediate_size=96)
    sd = LuminaModel(cfg).state_dict()
    for i in range(2):
        assert sd[f"model.layers.{i}.mlp.gate_proj.weight"].shape == (96, cfg.hidden_size)
        assert f"model.layers.{i}.mlp.gate.weight" not in sd
    for i in range(2, 4):
        assert sd[f"model.layers.{i}.mlp.experts.gate_proj"].shape == (cfg.num_experts, 32, cfg.hidden_size)
        assert f"model.layers.{i}.mlp.gate_proj.weight" not in sd
