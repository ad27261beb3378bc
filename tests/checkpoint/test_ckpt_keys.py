"""Key names and shapes: the generator, the real model and the split export all equal the contract's list."""

from __future__ import annotations

import pytest
import torch
from checkpoint_helpers import contract_keys

from lumina.checkpoint import (
    export_plan,
    official_buffer_dtype,
    official_shapes,
    parse_split_expert_key,
    split_expert_key,
)
from lumina.model import LuminaConfig, LuminaModel


@pytest.mark.parametrize("preset", ["tiny", "official"])
@pytest.mark.parametrize("layout", ["split", "fused"])
def test_generator_equals_contract(preset: str, layout: str) -> None:
    cfg = getattr(LuminaConfig, preset)()
    assert official_shapes(cfg, layout) == contract_keys(cfg, layout)


def test_official_key_count_by_hand() -> None:
    # backbone 1 + 8 + 1; layer 0: 2 norms + 4 attention + 3 MLP; each of 19 MoE layers: 2 norms + 4 attention
    # + gate weight + expert_bias + 3 shared + 256 * 3 experts; norm, lm_head, 8 image heads; channel head:
    # 2 condition_proj + channel_embed + timesteps + channel_mask + 2 channel_norm + 2 final, 6 blocks of 18.
    split = 10 + 9 + 19 * (6 + 2 + 3 + 768) + 1 + 1 + 8 + 9 + 6 * 18
    fused = split - 19 * (768 - 3)
    assert len(official_shapes(LuminaConfig.official(), "split")) == split == 14947
    assert len(official_shapes(LuminaConfig.official(), "fused")) == fused


def test_official_parameter_count_is_16_9b() -> None:
    numel = sum(torch.Size(s).numel() for s in official_shapes(LuminaConfig.official()).values())
    assert 16.8e9 < numel < 17.0e9  # the contract's own arithmetic: about 16.9B


@pytest.mark.parametrize("preset", ["tiny", "official"])
def test_model_state_dict_is_contract_fused_layout(preset: str) -> None:
    cfg = getattr(LuminaConfig, preset)()
    with torch.device("meta"):
        model = LuminaModel(cfg)
    state = model.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == contract_keys(cfg, "fused")
    assert state["multi_codebook_head.channel_mask"].dtype == torch.bfloat16
    assert all(state[k].dtype == torch.float32 for k in state if k.endswith("mlp.gate.expert_bias"))


@pytest.mark.parametrize("preset", ["tiny", "official"])
def test_split_export_names_equal_contract(preset: str) -> None:
    """The export plan of a meta model (nothing written, nothing allocated) names exactly the official
    split keys, with their shapes."""
    cfg = getattr(LuminaConfig, preset)()
    with torch.device("meta"):
        model = LuminaModel(cfg)
    state = model.state_dict()
    plan = export_plan(((k, tuple(t.shape), t.dtype) for k, t in state.items()),
                       lambda key, e: state[key], "split", None)
    assert len(plan) == len({p.name for p in plan})
    assert {p.name: p.shape for p in plan} == contract_keys(cfg, "split")


def test_split_export_is_expert_major() -> None:
    cfg = LuminaConfig.tiny()
    shapes = official_shapes(cfg)
    plan = export_plan(((k, s, torch.float32) for k, s in shapes.items()), lambda k, e: None, "split", None)
    names = [p.name for p in plan if ".mlp.experts." in p.name and p.name.startswith("model.layers.1.")]
    assert names[:4] == ["model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight",
                         "model.layers.1.mlp.experts.0.down_proj.weight", "model.layers.1.mlp.experts.1.gate_proj.weight"]


def test_expert_key_grammar() -> None:
    fused = "model.layers.7.mlp.experts.down_proj"
    assert split_expert_key(fused, 12) == "model.layers.7.mlp.experts.12.down_proj.weight"
    assert parse_split_expert_key("model.layers.7.mlp.experts.12.down_proj.weight") == (fused, 12)
    for not_split in ("model.layers.7.mlp.experts.012.down_proj.weight",  # leading zero: a different name
                      "model.layers.7.mlp.experts.12.down_proj",
                      "model.layers.7.mlp.shared_experts.down_proj.weight",
                      "model.layers.7.mlp.experts.12.proj.weight"):
        assert parse_split_expert_key(not_split) is None, not_split
    with pytest.raises(ValueError, match="model.layers.7.mlp.gate.weight"):
        split_expert_key("model.layers.7.mlp.gate.weight", 0)


def test_buffer_dtypes() -> None:
    assert official_buffer_dtype("model.layers.3.mlp.gate.expert_bias") == torch.float32
    assert official_buffer_dtype("multi_codebook_head.channel_mask") == torch.bfloat16
    assert official_buffer_dtype("model.layers.3.mlp.gate.weight") is None
    assert official_buffer_dtype("multi_codebook_head.channel_embed") is None


def test_model_persistent_buffers_are_the_official_ones(tiny_config: LuminaConfig) -> None:
    with torch.device("meta"):
        model = LuminaModel(tiny_config)
    persistent = set(model.state_dict())
    buffers = {name for name, _ in model.named_buffers() if name in persistent}
    assert buffers == {k for k in persistent if official_buffer_dtype(k) is not None}


def test_unknown_layout_names_value() -> None:
    with pytest.raises(ValueError, match="'stacked'"):
        official_shapes(LuminaConfig.tiny(), "stacked")
