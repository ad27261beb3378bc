"""LuminaConfig.from_hf / to_hf against the released config.json (a verbatim copy: official_config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumina.model import LuminaConfig

OFFICIAL_JSON = Path(__file__).with_name("official_config.json")
# sizes the official code hard-codes, which lumina writes as real fields (the official loader ignores them)
HARD_CODED = {"image_vocab_size": 5010, "codebook_size": 4096, "channel_depth": 6, "channel_heads": 8,
              "channel_mlp_ratio": 4}


def test_the_released_config_json_reads_as_the_official_preset() -> None:
    for source in (OFFICIAL_JSON, str(OFFICIAL_JSON), json.loads(OFFICIAL_JSON.read_text())):
        assert LuminaConfig.from_hf(source) == LuminaConfig.official()
    cfg = LuminaConfig.from_hf(OFFICIAL_JSON)
    assert (cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group) == \
        (2048, 256, 8, 8, 4)
    assert (cfg.rotary_dims, cfg.num_moe_layers, cfg.pad_token_id, cfg.extra) == (64, 19, 156892, {})


def test_to_hf_writes_every_released_key_unchanged_then_the_hard_coded_sizes() -> None:
    raw = json.loads(OFFICIAL_JSON.read_text())
    out = LuminaConfig.from_hf(OFFICIAL_JSON).to_hf()
    assert {k: out[k] for k in raw} == raw  # values, auto_map included
    # then the hard-coded sizes and lumina's parts (the official loader ignores both)
    assert {k: v for k, v in out.items() if k not in raw} == {**HARD_CODED, "image_head": "channel_ar",
                                                                  "masking_schedule": "official", "attn_rule": "auto"}
    assert list(out)[:len(raw)] == list(raw)  # the released file's key order
    assert all(k not in out for k in ("attn_backend", "moe_backend", "check_finite", "extra"))


def test_the_image_head_is_written_and_read_back_and_a_file_without_it_gets_the_official_one() -> None:
    raw = json.loads(OFFICIAL_JSON.read_text())
    assert "image_head" not in raw and LuminaConfig.from_hf(raw).image_head == "channel_ar"
    out = LuminaConfig.official(image_head="parallel").to_hf()
    assert out["image_head"] == "parallel" and LuminaConfig.from_hf(out).image_head == "parallel"


def test_unknown_keys_and_a_custom_auto_map_survive_a_round_trip(tmp_path: Path) -> None:
    raw = json.loads(OFFICIAL_JSON.read_text())
    raw["auto_map"] = {"AutoConfig": "my_config.MyConfig"}
    raw["release_note"] = {"stage": 2}
    cfg = LuminaConfig.from_hf(raw)
    assert cfg.extra == {"release_note": {"stage": 2}}
    cfg.save_hf(tmp_path)
    again = json.loads((tmp_path / "config.json").read_text())
    assert again["auto_map"] == {"AutoConfig": "my_config.MyConfig"}
    assert again["release_note"] == {"stage": 2}
    assert LuminaConfig.from_hf(tmp_path) == cfg  # a directory path reads its config.json


@pytest.mark.parametrize(("change", "field"), [
    ({"num_key_value_heads": 3}, "num_attention_heads"),
    ({"n_group": 6}, "n_group"),
    ({"rotary_dim": 32}, "rotary_dim"),
    ({"hidden_size": "2048"}, "hidden_size"),
])
def test_an_inconsistent_config_json_raises_naming_the_field(change: dict, field: str) -> None:
    raw = {**json.loads(OFFICIAL_JSON.read_text()), **change}
    with pytest.raises(ValueError, match=rf"LuminaConfig\.{field}="):
        LuminaConfig.from_hf(raw)
