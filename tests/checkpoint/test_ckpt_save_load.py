"""Save -> files -> load on tiny models: bit-exact round trips, layouts, shards, bf16 export, assets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_bit_equal, contract_keys, naive_fuse, read_dir
from safetensors import safe_open
from safetensors.torch import load_file

from lumina.checkpoint import PlannedTensor, load_pretrained, parse_size, save_pretrained
from lumina.checkpoint.writer import write_shards
from lumina.model import LuminaConfig, LuminaModel


@pytest.mark.parametrize("model_name", ["fp32_model", "bf16_model"])
@pytest.mark.parametrize("layout", ["split", "fused"])
def test_save_load_bit_exact(model_name: str, layout: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    model: LuminaModel = request.getfixturevalue(model_name)
    save_pretrained(model, tmp_path, layout=layout)
    loaded = load_pretrained(tmp_path)  # dtype=None: the checkpoint's dtypes
    assert_bit_equal(loaded.state_dict(), model.state_dict())
    # the non-persistent buffers were rebuilt, not left on meta
    assert not any(t.is_meta for t in list(loaded.parameters()) + list(loaded.buffers()))
    assert torch.equal(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)


def test_split_files_hold_official_names_and_expert_slices(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)  # default layout: split
    files = read_dir(tmp_path)
    assert {k: tuple(t.shape) for k, t in files.items()} == contract_keys(fp32_model.config, "split")
    state = fp32_model.state_dict()
    assert torch.equal(files["model.layers.2.mlp.experts.5.down_proj.weight"],
                       state["model.layers.2.mlp.experts.down_proj"][5])
    assert_bit_equal(naive_fuse(files), state)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llada2_moe"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_internluminau2.LLaDA2MoeModelLM"
    assert config["torch_dtype"] == "float32"


def test_fused_files_and_config(bf16_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(bf16_model, tmp_path, layout="fused")
    assert_bit_equal(read_dir(tmp_path), bf16_model.state_dict())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llada2_moe_veomni"
    assert config["torch_dtype"] == "bfloat16"


def test_split_and_fused_checkpoints_load_identically(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path / "split", layout="split")
    save_pretrained(fp32_model, tmp_path / "fused", layout="fused")
    assert_bit_equal(load_pretrained(tmp_path / "split").state_dict(), load_pretrained(tmp_path / "fused").state_dict())


def test_sharded_save_loads_back(bf16_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(bf16_model, tmp_path, max_shard_size="300KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    n = len(shards)
    assert n > 2
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    state = bf16_model.state_dict()
    # total_size: bytes of every tensor, from the model's own tensors
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    assert set(index["weight_map"]) == set(contract_keys(bf16_model.config, "split"))
    assert set(index["weight_map"].values()) == set(shards)
    for shard in shards:
        with safe_open(tmp_path / shard, framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
            keys = set(handle.keys())
            assert keys == {k for k, v in index["weight_map"].items() if v == shard}
        # no shard passes the limit unless it holds one oversized tensor
        size = sum(t.numel() * t.element_size() for t in load_file(tmp_path / shard).values())
        assert size <= 300_000 or len(keys) == 1, shard
    assert_bit_equal(load_pretrained(tmp_path).state_dict(), state)


def test_bf16_export_casts_parameters_only(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path, dtype="bf16")
    files = naive_fuse(read_dir(tmp_path))
    state = fp32_model.state_dict()
    for key, tensor in files.items():
        if key.endswith("mlp.gate.expert_bias"):
            assert tensor.dtype == torch.float32, key
            assert torch.equal(tensor, state[key])  # not rounded through bf16
        else:
            assert tensor.dtype == torch.bfloat16, key
            assert torch.equal(tensor, state[key].to(torch.bfloat16)), key
    mask = files["multi_codebook_head.channel_mask"]
    c = fp32_model.config.num_codebooks
    expected = torch.triu(torch.full((c, c), float("-inf")), diagonal=1).to(torch.bfloat16)
    assert torch.equal(mask, expected)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = load_pretrained(tmp_path)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert loaded.model.layers[1].mlp.gate.expert_bias.dtype == torch.float32


def test_load_with_requested_dtype(bf16_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(bf16_model, tmp_path)
    loaded = load_pretrained(tmp_path, dtype=torch.float32)
    state = loaded.state_dict()
    for key, tensor in bf16_model.state_dict().items():
        want = torch.bfloat16 if key.endswith("channel_mask") else torch.float32
        assert state[key].dtype == want, key
        assert torch.equal(state[key], tensor.to(want)), key  # bf16 -> fp32 is exact


def test_source_assets_copied(fp32_model: LuminaModel, tokenizer_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    save_pretrained(fp32_model, out, source_dir=tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "merges.txt", "vocab.json",
                 "modeling_internluminau2.py", "configuration_internluminau2.py", "tokenbridge.py"):
        assert (out / name).read_bytes() == (tokenizer_dir / name).read_bytes(), name
    assert not (out / "README.md").exists() and not (out / "notes.bin").exists()


def test_config_keeps_unknown_keys(tmp_path: Path) -> None:
    cfg = LuminaConfig.tiny(extra={"my_release_note": "v1"})
    torch.manual_seed(0)
    save_pretrained(LuminaModel(cfg), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["my_release_note"] == "v1"
    assert load_pretrained(tmp_path).config.extra["my_release_note"] == "v1"


def test_refuses_to_mix_with_old_weights(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path, max_shard_size="300KB")
    with pytest.raises(FileExistsError, match="model-00001-of-"):
        save_pretrained(fp32_model, tmp_path)
    save_pretrained(fp32_model, tmp_path, overwrite=True)  # one 7 MB shard replaces the many small ones
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]
    assert_bit_equal(load_pretrained(tmp_path).state_dict(), fp32_model.state_dict())


def test_save_state_dict_checks_keys(fp32_model: LuminaModel, tmp_path: Path) -> None:
    state = dict(fp32_model.state_dict())
    state["lm_head.weights"] = state.pop("lm_head.weight")
    with pytest.raises(ValueError, match=r"(?s)missing.*lm_head\.weight.*unexpected.*lm_head\.weights"):
        save_pretrained(state, tmp_path, config=fp32_model.config)
    with pytest.raises(ValueError, match="config is required"):
        save_pretrained(fp32_model.state_dict(), tmp_path)


@pytest.mark.parametrize(("kwargs", "named"), [({"layout": "stacked"}, "'stacked'"), ({"dtype": "int8"}, "'int8'"),
                                                ({"max_shard_size": "5 parsecs"}, "5 parsecs"),
                                                ({"max_shard_size": 0}, "max_shard_size=0")])
def test_bad_arguments_name_the_value(fp32_model: LuminaModel, tmp_path: Path, kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        save_pretrained(fp32_model, tmp_path, **kwargs)


def test_parse_size() -> None:
    assert parse_size("5GB") == 5_000_000_000
    assert parse_size("500MiB") == 500 * 1024 * 1024
    assert parse_size("1.5kb") == 1500
    assert parse_size(123) == 123 and parse_size("123") == 123
    for bad in ("five GB", "5 XB", "-5GB", True):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_size(bad)


def test_bad_argument_leaves_existing_export_alone(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="max_shard_size"):
        save_pretrained(fp32_model, tmp_path, overwrite=True, max_shard_size="lots")
    with pytest.raises(FileNotFoundError, match="no_such_release"):
        save_pretrained(fp32_model, tmp_path, overwrite=True, source_dir=tmp_path / "no_such_release")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert_bit_equal(load_pretrained(tmp_path).state_dict(), fp32_model.state_dict())


def index_keys(directory: Path) -> list[str]:
    return list(json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"])


def test_split_export_passes_the_official_layout_check(fp32_model: LuminaModel, tmp_path: Path) -> None:
    """The official loader reads the index, refuses fused expert keys (`mlp.experts.<proj>`, with or without
    `.weight`) and requires per-expert keys (`mlp.experts.<e>.<proj>`)."""
    fused_key = re.compile(r"\.mlp\.experts\.(gate_proj|up_proj|down_proj)(\.weight)?$")
    split_key = re.compile(r"\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)(\.weight)?$")
    split = index_keys(save_pretrained(fp32_model, tmp_path / "split"))
    assert not any(fused_key.search(k) for k in split)
    assert sum(bool(split_key.search(k)) for k in split) == 2 * 8 * 3  # 2 MoE layers x 8 experts x 3
    fused = index_keys(save_pretrained(fp32_model, tmp_path / "fused", layout="fused"))
    assert sum(bool(fused_key.search(k)) for k in fused) == 2 * 3


def test_meta_model_cannot_be_saved(tiny_config: LuminaConfig, tmp_path: Path) -> None:
    with torch.device("meta"):
        model = LuminaModel(tiny_config)
    with pytest.raises(ValueError, match=r"meta device .*model\.word_embeddings\.weight"):
        save_pretrained(model, tmp_path)
    assert not list(tmp_path.glob("*"))


def test_writer_guards(tmp_path: Path) -> None:
    def planned(name: str, shape: tuple[int, ...], produced: torch.Tensor) -> PlannedTensor:
        return PlannedTensor(name, shape, torch.float32, lambda: produced)

    with pytest.raises(ValueError, match=r"lm_head\.weight: produced shape \[3\], planned \[2\]"):
        write_shards(tmp_path, [planned("lm_head.weight", (2,), torch.zeros(3))], "1MB")
    with pytest.raises(ValueError, match=r"twice: \['a'\]"):
        write_shards(tmp_path, [planned("a", (1,), torch.zeros(1))] * 2 + [planned("b", (1,), torch.zeros(1))], "1MB")
    # 3 tensors of 400 bytes with a 1000-byte limit: shards [a, b] and [c]
    index = write_shards(tmp_path, [planned(n, (100,), torch.full((100,), float(i))) for i, n in enumerate("abc")],
                         1000)
    assert index == {"metadata": {"total_size": 1200},
                     "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                                    "c": "model-00002-of-00002.safetensors"}}
    assert torch.equal(read_dir(tmp_path)["c"], torch.full((100,), 2.0))
