"""LuminaConfig.validate: bad configs raise naming the field."""

from __future__ import annotations

import pytest

from lumina.model import LuminaConfig


@pytest.mark.parametrize(("overrides", "field"), [
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_attention_heads"),
    (dict(num_experts=8, n_group=3), "n_group"),
    (dict(num_experts=8, n_group=8, topk_group=2), "n_group"),  # groups of one expert cannot be top-2 scored
    (dict(n_group=4, topk_group=5), "topk_group"),
    (dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=5), "num_experts_per_tok"),
    (dict(head_dim=16, rotary_dim=None, partial_rotary_factor=0.3125), "partial_rotary_factor"),  # 5 dims
    (dict(rotary_dim=6), "rotary_dim"),
    (dict(hidden_size=60, channel_heads=8), "channel_heads"),
    (dict(codebook_size=6000), "codebook_size"),
    (dict(pad_token_id=512), "pad_token_id"),
    (dict(moe_backend="triton"), "moe_backend"),
    (dict(first_k_dense_replace=4), "first_k_dense_replace"),
    (dict(hidden_size=0), "hidden_size"),
])
def test_bad_config_raises_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"LuminaConfig\.{field}="):
        LuminaConfig.tiny(**overrides)


def test_official_and_tiny_configs_validate() -> None:
    assert LuminaConfig.official().rotary_dims == 64
    assert LuminaConfig.tiny().num_moe_layers == 2
