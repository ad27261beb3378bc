"""split <-> fused conversion, via `convert_checkpoint` and the `lumina-convert` console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_bit_equal, contract_keys, naive_fuse, read_dir
from safetensors.torch import save_file

from lumina.checkpoint import CheckpointMismatchError, convert_checkpoint, save_pretrained
from lumina.cli.convert import main
from lumina.model import LuminaModel

ASSETS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "merges.txt", "vocab.json",
          "modeling_internluminau2.py", "configuration_internluminau2.py", "tokenbridge.py")


@pytest.fixture
def split_dir(bf16_model: LuminaModel, tokenizer_dir: Path, tmp_path: Path) -> Path:
    return save_pretrained(bf16_model, tmp_path / "split", max_shard_size="400KB", source_dir=tokenizer_dir)


def model_type(directory: Path) -> str:
    return json.loads((directory / "config.json").read_text())["model_type"]


def test_function_round_trip(split_dir: Path, bf16_model: LuminaModel, tmp_path: Path) -> None:
    fused = convert_checkpoint(split_dir, tmp_path / "fused", layout="fused", max_shard_size="1MB")
    back = convert_checkpoint(fused, tmp_path / "back", layout="split", max_shard_size="400KB")
    assert model_type(fused) == "llada2_moe_veomni" and model_type(back) == "llada2_moe"
    fused_tensors = read_dir(fused)
    assert_bit_equal(fused_tensors, bf16_model.state_dict())
    assert_bit_equal(fused_tensors, naive_fuse(read_dir(split_dir)))
    assert_bit_equal(read_dir(back), read_dir(split_dir))
    assert set(json.loads((back / "model.safetensors.index.json").read_text())["weight_map"]) == \
        set(contract_keys(bf16_model.config, "split"))
    for directory in (fused, back):
        for name in ASSETS:
            assert (directory / name).read_bytes() == (split_dir / name).read_bytes(), (directory, name)


def test_convert_to_bf16_keeps_expert_bias_fp32(fp32_model: LuminaModel, tmp_path: Path) -> None:
    src = save_pretrained(fp32_model, tmp_path / "fp32", layout="fused")
    out = convert_checkpoint(src, tmp_path / "bf16", layout="split", dtype="bf16")
    tensors = naive_fuse(read_dir(out))
    for key, tensor in fp32_model.state_dict().items():
        want = torch.float32 if key.endswith("expert_bias") else torch.bfloat16
        assert tensors[key].dtype == want, key
        assert torch.equal(tensors[key], tensor.to(want)), key
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_convert_validates_against_config(split_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(split_dir, bad)
    tensors = read_dir(bad)
    for path in list(bad.glob("*.safetensors")) + [bad / "model.safetensors.index.json"]:
        path.unlink()
    tensors["model.layers.1.mlp.experts.4.gate_proj.weight"] = tensors["model.layers.1.mlp.experts.4.gate_proj.weight"][:, :-1]
    save_file({k: v.contiguous() for k, v in tensors.items()}, bad / "model.safetensors")
    with pytest.raises(CheckpointMismatchError, match=r"model\.layers\.1\.mlp\.experts\.4\.gate_proj\.weight"):
        convert_checkpoint(bad, tmp_path / "out", layout="fused")
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_convert_refuses_its_source(split_dir: Path) -> None:
    with pytest.raises(ValueError, match="is the source directory"):
        convert_checkpoint(split_dir, split_dir, layout="fused", overwrite=True)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    sibling = Path(sys.executable).with_name("lumina-convert")  # skips a pyenv shim when there is one
    exe = str(sibling) if sibling.exists() else shutil.which("lumina-convert")
    assert exe is not None, "lumina-convert console script is not installed (pip install -e .)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_cli_round_trip(split_dir: Path, tmp_path: Path) -> None:
    fused, back = tmp_path / "cli_fused", tmp_path / "cli_back"
    done = run_cli(str(split_dir), str(fused), "--layout", "fused", "--max-shard-size", "1MB")
    assert done.returncode == 0, done.stderr
    done = run_cli(str(fused), str(back), "--layout", "split", "--dtype", "keep", "--max-shard-size", "400KB")
    assert done.returncode == 0, done.stderr
    assert model_type(fused) == "llada2_moe_veomni" and model_type(back) == "llada2_moe"
    assert_bit_equal(read_dir(fused), naive_fuse(read_dir(split_dir)))
    assert_bit_equal(read_dir(back), read_dir(split_dir))
    for name in ASSETS:
        assert (back / name).read_bytes() == (split_dir / name).read_bytes(), name


def test_cli_rejects_unknown_layout(split_dir: Path, tmp_path: Path) -> None:
    done = run_cli(str(split_dir), str(tmp_path / "x"), "--layout", "stacked")
    assert done.returncode == 2 and "stacked" in done.stderr


def test_cli_reports_bad_checkpoint(split_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    index_path = split_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.1.mlp.experts.9.up_proj.weight"] = index["weight_map"]["model.norm.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(SystemExit) as exit_info:
        main([str(split_dir), str(tmp_path / "out"), "--layout", "fused"])
    assert exit_info.value.code == 2  # bad input
    assert "'model.layers.1.mlp.experts.9.up_proj.weight' is listed in model.safetensors.index.json" in \
        capsys.readouterr().err


def test_cli_never_overwrites_or_mixes_an_output(split_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    main([str(split_dir), str(out), "--layout", "fused", "--max-shard-size", "400KB"])
    many = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(many) > 1
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        main([str(split_dir), str(out), "--layout", "fused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("lumina-convert: error:")
    assert str(out) in err[0] and "not empty" in err[0] and "--overwrite" in err[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    main([str(split_dir), str(out), "--layout", "fused", "--max-shard-size", "1GB", "--overwrite"])
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]
    assert_bit_equal(read_dir(out), naive_fuse(read_dir(split_dir)))
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main([str(split_dir), str(tmp_path / "file"), "--layout", "fused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"output {tmp_path / 'file'} is an existing file" in err[0]
