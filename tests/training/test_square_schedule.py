"""The square masking schedule (lumina/schedules/square.py), chosen by name: its hand values; training on
the built-in world with the real Trainer under the FSDP2 strategy (a DCP checkpoint); the checkpoint and the HF
export carrying the name and lumina's reader and `lumina-generate`'s loader rebuilding it; the samplers and the
training noise both following the one name; the official layout refusing it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from train_helpers import run_cli, small_data

from lumina.checkpoint import load_pretrained, save_pretrained
from lumina.contract.roles import TokenType
from lumina.contract.schema import Text
from lumina.distributed import load_dcp_weights
from lumina.generation import Prompt, TextSamplingConfig, generate_text
from lumina.generation.assets import load_assets, load_model
from lumina.generation.image import generate_images
from lumina.generation.sampling_config import ImageSamplingConfig
from lumina.model import LuminaConfig, LuminaModel
from lumina.schedules import build_schedule
from lumina.training.data_factory import build_datamodule

STEPS = 40


def test_square_hand_values():
    square = build_schedule("square")
    t = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    assert square.text_mask_prob(t).tolist() == [0.4375, 0.75, 1.0]  # 1 - (1 - t)^2
    # 2 (1 - t) / (t (2 - t)): 1.5 / 0.4375, 1 / 0.75, 0
    torch.testing.assert_close(square.scale_text_loss(torch.ones(3, dtype=torch.float64), t),
                               torch.tensor([24 / 7, 4 / 3, 0.0], dtype=torch.float64))
    # 10 slots over 4 steps: still masked floor(10 (1 - (k+1)^2 / 16)) = 9, 7, 4, 0
    assert square.text_commits(10, 4) == [1, 2, 3, 4]
    assert [square.image_keep(10, k, 4) for k in range(4)] == [9, 7, 4, 0]
    assert square.image_mask_ratio(0.5) == 0.75


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """`lumina-train experiment=ablation_schedule_square` for 40 steps under strategy=fsdp_ep on one process."""
    run_dir = tmp_path_factory.mktemp("square")
    result = run_cli(["experiment=ablation_schedule_square", f"trainer.max_steps={STEPS}",
                      f"trainer.val_check_interval={STEPS}", f"callbacks.checkpoint.every_n_train_steps={STEPS}",
                      "strategy=fsdp_ep", "trainer.devices=1", "logger=csv", "trainer.enable_progress_bar=false",
                      "trainer.enable_model_summary=false", "callbacks.progress_bar=null",
                      f"hydra.run.dir={run_dir}", *small_data(num_samples=48)], cwd=run_dir, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_training_with_the_square_schedule_lowers_the_loss(trained):
    rows = csv.DictReader((trained / "csv" / "version_0" / "metrics.csv").open())
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == STEPS
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < 0.85 * first, (first, last)


def test_the_dcp_checkpoint_and_the_hf_export_carry_the_schedule(trained):
    checkpoint = trained / "checkpoints" / "last.ckpt"
    assert (checkpoint / "meta.pt").is_file()  # a DCP directory
    meta = torch.load(checkpoint / "meta.pt", weights_only=False)
    model_fields = meta["hyper_parameters"]["model"]
    assert model_fields["masking_schedule"] == "square"
    from_dcp = load_dcp_weights(LuminaModel(LuminaConfig(**model_fields)), checkpoint)
    exported = json.loads((trained / "hf" / "config.json").read_text())
    assert exported["masking_schedule"] == "square"
    from_hf = load_pretrained(trained / "hf")  # lumina's reader
    assert from_hf.config.masking_schedule == "square"
    for name, tensor in from_dcp.state_dict().items():
        assert torch.equal(from_hf.state_dict()[name], tensor), name


def test_resuming_under_another_schedule_is_refused(trained, tmp_path):
    result = run_cli(["experiment=ablation_schedule_official", f"trainer.max_steps={STEPS + 1}",
                      "strategy=fsdp_ep", "trainer.devices=1", "logger=none", f"hydra.run.dir={trained}",
                      *small_data(num_samples=48)], cwd=tmp_path, timeout=600)
    assert result.returncode != 0
    assert "masking_schedule='official'" in result.stderr and "trained with 'square'" in result.stderr


def test_the_official_layout_refuses_the_square_schedule(tmp_path):
    model = LuminaModel(LuminaConfig.tiny(masking_schedule="square"))
    with pytest.raises(ValueError, match=r"layout='split'.*masking_schedule='square'"):
        save_pretrained(model, tmp_path / "split", layout="split")
    save_pretrained(model, tmp_path / "fused", layout="fused")
    assert load_pretrained(tmp_path / "fused").config.masking_schedule == "square"


def _masked_before_each_step(model, tokens, block: int, steps: int) -> list[int]:
    """Masked slots of a one-block answer before each text-sampler step (the block ends the pack; the full
    forward, `cache=False`, so each step's pack holds the whole sequence)."""
    seen, real = [], model.backbone
    model.backbone = lambda batch: (seen.append(int((batch.input_ids[0, -block:, 0] == tokens.text_mask).sum())),
                                    real(batch))[1]
    generate_text(model, [Prompt([Text([20])], key=0)], tokens,
                  TextSamplingConfig(gen_length=block, block_length=block, steps=steps, cache=False))
    del model.backbone
    return seen


def _committed_after_each_step(model, tokens) -> list[int]:
    trace = []
    generate_images(model, [Prompt([Text([20])], key=0, grid=(4, 4))], tokens,
                    ImageSamplingConfig(steps=4, cfg_scale=0.0), trace=trace)
    return [step.committed[0] for step in trace]


def test_lumina_generate_samples_with_the_exported_schedule(trained):
    model = load_model(trained / "hf")  # what lumina-generate loads
    tokens = load_assets(trained / "hf", "auto", model.config).tokens
    # square: 8 slots over 4 steps keep floor(8 (1 - (k+1)^2/16)) = 7, 6, 3, 0 masked (official: 6, 4, 2, 0)
    assert _masked_before_each_step(model, tokens, 8, 4) == [8, 7, 6, 3]
    # 16 cells over 4 steps keep 15, 12, 7, 0 (official cosine: 14, 11, 6, 0)
    assert _committed_after_each_step(model, tokens) == [1, 4, 9, 16]


def _training_noise(model_config: LuminaConfig):
    """The built-in world's training source as lumina-train builds it for `model_config`."""
    data = {"pad_id": 0, "num_codebooks": 4,  # the world's (conf/data/builtin.yaml)
            "sources": [{"name": "world", "path": None, "options": {"num_samples": 200, "val_samples": 4}}]}
    return build_datamodule(data, model_config).train_source


def _text_mask_fraction(source) -> tuple[float, torch.Tensor]:
    """Masked fraction of the epoch-0 text-answer rows at noise times t > 0.3, and those t."""
    masked, times = [], []
    for i in range(len(source)):
        seq = source.sequence(i, 0)
        rows = seq.answer_mask & (seq.type_ids == TokenType.TEXT_ANSWER) & (seq.noise_t > 0.3)
        masked.append(seq.input_ids[rows, 0] == source.dataset.tokens.text_mask)
        times.append(seq.noise_t[rows])
    return float(torch.cat(masked).float().mean()), torch.cat(times).double()


@pytest.mark.parametrize(("name", "masked_before", "committed"),
                         [("square", [8, 7, 6, 3], [1, 4, 9, 16]), ("official", [8, 6, 4, 2], [2, 5, 10, 16])])
def test_one_name_moves_both_the_training_noise_and_the_samplers(name, masked_before, committed):
    """The model config's name alone decides the text masking of the training data (the masked fraction follows
    its p(t), not the other schedule's) and both samplers' counts (official: linear text, cosine images)."""
    config = LuminaConfig.tiny(masking_schedule=name)
    source = _training_noise(config)
    fraction, t = _text_mask_fraction(source)
    assert t.numel() > 300
    other = "official" if name == "square" else "square"
    mine, theirs = (float(build_schedule(n).text_mask_prob(t).mean()) for n in (name, other))
    assert abs(fraction - mine) < 0.04 and abs(fraction - theirs) > 0.08, (fraction, mine, theirs)

    torch.manual_seed(0)
    model = LuminaModel(config).eval()
    assert _masked_before_each_step(model, source.dataset.tokens, 8, 4) == masked_before
    assert _committed_after_each_step(model, source.dataset.tokens) == committed
