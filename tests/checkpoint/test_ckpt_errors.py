"""Bad checkpoints: every renamed, missing, unexpected, mis-shaped or doubly defined key is named, all in one
error, before any weight is read. Mixed split/fused layouts are accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_bit_equal, read_dir, seeded_model
from safetensors.torch import save_file

from lumina.checkpoint import (
    CheckpointMismatchError,
    load_hf_state_dict_into,
    load_pretrained,
    save_pretrained,
)
from lumina.model import LuminaConfig, LuminaModel

Edit = Callable[[dict[str, torch.Tensor]], None]


def rewritten(model: LuminaModel, tmp_path: Path, edit: Edit, layout: str = "split") -> Path:
    """Save `model`, then rewrite its weights as one model.safetensors after `edit` changed the tensor dict."""
    directory = tmp_path / f"ckpt_{layout}"
    save_pretrained(model, directory, layout=layout)
    tensors = read_dir(directory)
    for path in list(directory.glob("*.safetensors")) + [directory / "model.safetensors.index.json"]:
        path.unlink()
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    return directory


def mismatch(directory: Path) -> CheckpointMismatchError:
    with pytest.raises(CheckpointMismatchError) as info:
        load_pretrained(directory)
    return info.value


def test_renamed_key_is_named(fp32_model: LuminaModel, tmp_path: Path) -> None:
    old, new = "model.layers.1.attention.dense.weight", "model.layers.1.attention.dense.weights"
    directory = rewritten(fp32_model, tmp_path, lambda t: t.__setitem__(new, t.pop(old)))
    err = mismatch(directory)
    assert err.missing == [old] and err.unexpected == [new]
    assert old in str(err) and new in str(err)


def test_renamed_split_expert_is_named(fp32_model: LuminaModel, tmp_path: Path) -> None:
    old = "model.layers.2.mlp.experts.3.up_proj.weight"
    new = "model.layers.2.mlp.experts.3.upproj.weight"
    err = mismatch(rewritten(fp32_model, tmp_path, lambda t: t.__setitem__(new, t.pop(old))))
    assert err.missing == [old] and err.unexpected == [new]


def test_mis_shaped_keys_are_named_with_shapes(fp32_model: LuminaModel, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t["lm_head.weight"][:-1]
        t["model.layers.1.mlp.experts.6.down_proj.weight"] = t["model.layers.1.mlp.experts.6.down_proj.weight"].T

    err = mismatch(rewritten(fp32_model, tmp_path, edit))
    message = str(err)
    assert "lm_head.weight: checkpoint [511, 64], expected [512, 64]" in message
    assert "model.layers.1.mlp.experts.6.down_proj.weight: checkpoint [32, 64], expected [64, 32]" in message
    assert len(err.mis_shaped) == 2 and not err.missing and not err.unexpected


def test_missing_and_unexpected_reported_together(fp32_model: LuminaModel, tmp_path: Path) -> None:
    gone = ["model.norm.weight", "model.layers.2.mlp.experts.7.gate_proj.weight", "lm_img_head.3.weight"]
    extra = ["model.layers.2.mlp.experts.8.gate_proj.weight",  # expert index 8 of E=8
             "model.layers.0.mlp.experts.0.gate_proj.weight",  # experts in the dense layer
             "vision_tower.weight"]

    def edit(t: dict[str, torch.Tensor]) -> None:
        for key in gone:
            del t[key]
        for key in extra:
            t[key] = torch.zeros(2, 2)

    err = mismatch(rewritten(fp32_model, tmp_path, edit))
    assert sorted(err.missing) == sorted(gone)
    assert len(err.unexpected) == 3
    for name in gone + extra:
        assert name in str(err), name
    assert "(6 problems)" in str(err)


def test_fully_missing_expert_tensor_names_both_forms(fp32_model: LuminaModel, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        for e in range(8):
            del t[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"]

    err = mismatch(rewritten(fp32_model, tmp_path, edit))
    assert len(err.missing) == 1
    assert "model.layers.1.mlp.experts.gate_proj" in err.missing[0]
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in err.missing[0]


def test_mixed_layouts_load(fp32_model: LuminaModel, tmp_path: Path) -> None:
    """Layer 1 fused (no .weight), layer 2 split, in a directory whose config claims split."""
    state = fp32_model.state_dict()

    def edit(t: dict[str, torch.Tensor]) -> None:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            for e in range(8):
                del t[f"model.layers.1.mlp.experts.{e}.{proj}.weight"]
            t[f"model.layers.1.mlp.experts.{proj}"] = state[f"model.layers.1.mlp.experts.{proj}"].clone()

    directory = rewritten(fp32_model, tmp_path, edit)
    assert json.loads((directory / "config.json").read_text())["model_type"] == "llada2_moe"
    assert_bit_equal(load_pretrained(directory).state_dict(), state)


def test_fused_and_split_definitions_of_one_tensor_conflict(fp32_model: LuminaModel, tmp_path: Path) -> None:
    fused = "model.layers.2.mlp.experts.up_proj"
    state = fp32_model.state_dict()
    err = mismatch(rewritten(fp32_model, tmp_path, lambda t: t.__setitem__(fused, state[fused].clone())))
    assert len(err.conflicting) == 1 and fused in err.conflicting[0]
    assert "conflicting" in str(err)


def test_split_experts_in_mixed_dtypes_conflict(fp32_model: LuminaModel, tmp_path: Path) -> None:
    key = "model.layers.1.mlp.experts.2.down_proj.weight"
    err = mismatch(rewritten(fp32_model, tmp_path, lambda t: t.__setitem__(key, t[key].to(torch.bfloat16))))
    assert len(err.conflicting) == 1 and "model.layers.1.mlp.experts.down_proj" in err.conflicting[0]


def test_failed_load_leaves_a_materialised_model_untouched(fp32_model: LuminaModel, tmp_path: Path) -> None:
    directory = rewritten(fp32_model, tmp_path, lambda t: t.pop("model.norm.weight"))
    target = seeded_model(fp32_model.config, seed=5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointMismatchError, match="model.norm.weight"):
        load_hf_state_dict_into(target, directory)
    assert_bit_equal(target.state_dict(), before)


def test_index_naming_the_wrong_shard(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path, max_shard_size="300KB")
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    key = "model.norm.weight"
    others = sorted(set(index["weight_map"].values()) - {index["weight_map"][key]})
    index["weight_map"][key] = others[0]
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' is stored in .* maps it to"):
        load_pretrained(tmp_path)


def test_index_naming_a_missing_shard(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path, max_shard_size="300KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ValueError, match=victim.name):
        load_pretrained(tmp_path)


def test_directory_without_weights(tmp_path: Path) -> None:
    LuminaConfig.tiny().save_hf(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_pretrained(tmp_path)


def test_requested_dtype_clashing_with_materialised_model(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)
    with pytest.raises(ValueError, match=r"lm_head\.weight \(torch\.float32, wanted torch\.bfloat16\)"):
        load_hf_state_dict_into(seeded_model(fp32_model.config), tmp_path, dtype="bf16")


def test_key_stored_in_two_shards(fp32_model: LuminaModel, tmp_path: Path) -> None:
    directory = rewritten(fp32_model, tmp_path, lambda t: None)
    tensors = read_dir(directory)
    (directory / "model.safetensors").unlink()
    first = {k: v for i, (k, v) in enumerate(sorted(tensors.items())) if i % 2 == 0}
    second = {k: v for k, v in tensors.items() if k not in first}
    second["model.norm.weight"] = tensors["model.norm.weight"].clone()  # also in the first
    first["model.norm.weight"] = tensors["model.norm.weight"]
    save_file(first, directory / "model-00001-of-00002.safetensors")
    save_file(second, directory / "model-00002-of-00002.safetensors")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in second if k not in first})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' is stored twice"):
        load_pretrained(directory)


def test_requested_device_clashing_with_materialised_model(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)
    with pytest.raises(ValueError, match=r"lm_head\.weight \(on cpu, wanted cuda\)"):
        load_hf_state_dict_into(seeded_model(fp32_model.config), tmp_path, device="cuda")
