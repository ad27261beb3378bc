"""A fast_dev_run of every experiment config through the Hydra compose API and the `run(cfg)` the CLI
calls; configs marked `requires_cuda` are skipped off-GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from train_helpers import CONF_DIR, compose_train, quiet, small_data

from lumina.checkpoint import save_pretrained
from lumina.checkpoint.official_parts import unofficial_parts
from lumina.model import LuminaConfig, LuminaModel
from lumina.training.run import run
from lumina.world import world_text_tokenizer

EXPERIMENTS = sorted(
    str(p.relative_to(CONF_DIR / "experiment").with_suffix(""))
    for p in (CONF_DIR / "experiment").rglob("*.yaml") if p.name != "base.yaml")


def test_the_experiment_list_covers_the_ablations():
    assert {"debug", "finetune", "ablation_attn_sdpa_dense", "ablation_attn_segmented", "ablation_balance_aux",
            "ablation_balance_bias", "ablation_text_weight_none", "ablation_text_weight_inverse_t",
            "flex", "flash_attn"} <= set(EXPERIMENTS)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """An HF checkpoint of a tiny model with the built-in world's tokenizer.json (what finetune loads)."""
    directory = tmp_path_factory.mktemp("hf_source")
    torch.manual_seed(0)
    save_pretrained(LuminaModel(LuminaConfig.tiny()), directory)
    world_text_tokenizer().save(directory / "tokenizer.json")
    return directory


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_fast_dev_run(experiment, tmp_path, hf_dir):
    overrides = [f"experiment={experiment}", "trainer.fast_dev_run=true", *quiet(tmp_path), *small_data()]
    cfg = compose_train(overrides)
    if OmegaConf.is_missing(cfg.model, "init_from"):  # experiments that start from an HF directory
        cfg = compose_train([*overrides, f"model.init_from={hf_dir}"])
    if cfg.requires_cuda and not torch.cuda.is_available():
        pytest.skip(f"experiment={experiment} needs CUDA")
    if cfg.callbacks.get("generation_eval") is not None:
        cfg.callbacks.generation_eval = None  # minutes of sampling; the generation tests cover it
    outputs = run(cfg)
    assert outputs.steps == 1
    assert len(outputs.losses) == 1 and torch.isfinite(torch.tensor(outputs.losses[0]))
    # the HF export holds the split layout the official loader reads; lumina's fused one for a model with a part
    # the released model does not use (its config.json names the parts)
    split = not unofficial_parts(LuminaConfig.from_hf(tmp_path / "hf"))
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in index["weight_map"]) == split
    assert any(k.endswith(".mlp.experts.gate_proj") for k in index["weight_map"]) != split
    if experiment == "finetune":
        assert (tmp_path / "hf" / "tokenizer.json").is_file()
        # training started from the loaded weights: the frozen-in-time reference is the source checkpoint
        source = json.loads((hf_dir / "config.json").read_text())
        exported = json.loads((tmp_path / "hf" / "config.json").read_text())
        assert exported["hidden_size"] == source["hidden_size"] == LuminaConfig.tiny().hidden_size


def test_finetune_starts_from_the_checkpoint_weights(tmp_path, hf_dir):
    """With lr 0 the exported weights equal the loaded ones exactly; the data is checked against the HF
    directory's own tokenizer.json without naming it."""
    cfg = compose_train(["experiment=finetune", "trainer.fast_dev_run=true", *quiet(tmp_path), *small_data(),
                         f"model.init_from={hf_dir}", "optim.lr=1e-30", "optim.warmup_steps=0"])
    assert cfg.data.tokenizer == f"{hf_dir}/tokenizer.json"
    run(cfg)
    shard = next((hf_dir).glob("model-*.safetensors"))
    out_shard = next((tmp_path / "hf").glob("model-*.safetensors"))
    with safe_open(shard, "pt") as a, safe_open(out_shard, "pt") as b:
        key = "model.word_embeddings.weight"
        assert torch.allclose(a.get_tensor(key), b.get_tensor(key), atol=1e-12, rtol=0)


def test_finetune_runs_the_conditioning_check(tmp_path, hf_dir, caplog):
    """experiment=finetune keeps the default callbacks: each validation logs, per task of the world's held-out
    samples, the loss next to its image-ignoring baseline (lumina.training.conditioning)."""
    caplog.set_level("INFO", logger="lumina.training.conditioning")
    cfg = compose_train(["experiment=finetune", "trainer.fast_dev_run=true", *quiet(tmp_path),
                         *small_data(), "data.sources.0.options.val_samples=24", f"model.init_from={hf_dir}"])
    run(cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "lumina.training.conditioning"]
    assert any(re.search(r"understand held-out loss [\d.]+ acc [\d.]+ \| image swapped: loss [\d.]+", m)
               for m in lines), lines
    assert any(re.search(r"t2i held-out loss [\d.]+ acc [\d.]+ \| prompt dropped: loss [\d.]+", m)
               for m in lines), lines
