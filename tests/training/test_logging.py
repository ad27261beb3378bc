"""What a run logs, read back from its TensorBoard event files; and `model.freeze` during training."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import compose_train, quiet, small_data

from lumina.training import build
from lumina.training.run import run, summary


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    out = tmp_path_factory.mktemp("logged")
    cfg = compose_train(["experiment=debug", *quiet(out), *small_data(), "logger=tensorboard",
                         "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
                         "callbacks.expert_usage.heatmap_every_n_steps=1",
                         "callbacks.checkpoint.every_n_train_steps=2"])
    outputs = run(cfg)
    events = EventAccumulator(str(outputs.tensorboard), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return outputs, events


def values(events: EventAccumulator, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in events.Scalars(tag)}


def test_every_step_logs_losses_tokens_throughput_lr_grad_norm_and_accuracy(logged):
    _, events = logged
    tags = set(events.Tags()["scalars"])
    per_step = ["train/loss", "train/text_loss", "train/image_loss", "train/balance_loss",
                "train/supervised_tokens", "train/text_tokens", "train/image_tokens", "train/tokens_per_sec",
                "train/lr", "train/grad_norm"] + [f"train/image_loss/cb{c}" for c in range(4)]
    for tag in per_step:
        assert tag in tags, tag
        assert sorted(values(events, tag)) == [0, 1], tag
    assert {"train/text_acc", "train/image_acc/cb0"} & tags  # at least one modality per step
    for step in (0, 1):
        v = {tag: values(events, tag)[step] for tag in per_step}
        # the total is the sum of its terms (text_weight = image_weight = 1)
        assert v["train/loss"] == pytest.approx(v["train/text_loss"] + v["train/image_loss"]
                                                + v["train/balance_loss"], rel=1e-5)
        assert v["train/supervised_tokens"] == v["train/text_tokens"] + v["train/image_tokens"] > 0
        assert v["train/tokens_per_sec"] > 0 and v["train/grad_norm"] > 0
        # the image loss is the mean over codebooks of the per-codebook losses
        assert v["train/image_loss"] == pytest.approx(sum(v[f"train/image_loss/cb{c}"] for c in range(4)) / 4,
                                                      rel=1e-5)
    # experiment=debug: lr 3e-3, warmup 2 -> (step + 1) / 3 of the peak
    assert values(events, "train/lr") == pytest.approx({0: 1e-3, 1: 2e-3})
    for tag in tags:
        if "_acc" in tag:
            assert all(0.0 <= x <= 1.0 for x in values(events, tag).values()), tag


def test_validation_logs_held_out_loss(logged):
    _, events = logged
    val = values(events, "val/loss")
    assert len(val) == 1 and all(x > 0 for x in val.values())


def test_expert_usage_scalars_and_heatmap(logged):
    outputs, events = logged
    tags = set(events.Tags()["scalars"])
    for layer in (1, 2):  # tiny: layer 0 dense, layers 1-2 MoE
        for stat in ("max_over_mean", "cv", "dead"):
            assert f"experts/layer{layer}/{stat}" in tags
    assert "experts/layer0/cv" not in tags
    for step, value in values(events, "experts/max_over_mean").items():
        assert 1.0 <= value <= 8.0, step  # between even and all tokens on one of 8 experts
    assert "experts/load_heatmap" in events.Tags()["images"]
    assert outputs.heatmap is not None and outputs.heatmap.is_file()


def test_run_reports_where_its_outputs_are(logged):
    outputs, _ = logged
    assert outputs.checkpoint is not None and outputs.checkpoint.name == "last.ckpt" and outputs.checkpoint.is_file()
    assert outputs.hf_export is not None and (outputs.hf_export / "config.json").is_file()
    assert outputs.tensorboard is not None and any(outputs.tensorboard.glob("events.out.tfevents.*"))
    assert outputs.heatmap is not None and outputs.heatmap.is_file()
    text = summary(outputs)
    for name, path in (("checkpoint", outputs.checkpoint), ("HF export", outputs.hf_export),
                       ("TensorBoard", outputs.tensorboard), ("expert heatmap", outputs.heatmap)):
        assert any(line.split()[:len(name.split())] == name.split() and line.rstrip().endswith(str(path))
                   for line in text.splitlines()), (name, text)
    assert "optimizer steps" in text.splitlines()[0] and "train loss" in text


class Snapshot(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.before = {n: p.detach().clone() for n, p in pl_module.model.named_parameters()}


def test_frozen_parameters_stay_out_of_the_optimizer_and_unchanged(tmp_path):
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), *small_data(), "logger=none",
                         "trainer.max_steps=2", "trainer.limit_val_batches=0", "callbacks.checkpoint=null",
                         "callbacks.hf_export=null", "model.freeze=[model.word_embeddings.*,lm_head.*]"])
    module = build.module(cfg)
    snapshot = Snapshot()
    trainer = build.trainer(cfg, [snapshot], [])
    trainer.fit(module, datamodule=build.datamodule(cfg, module.model_config))
    frozen = {"model.word_embeddings.weight", "lm_head.weight"}
    assert set(module.frozen_names) == frozen
    params = dict(module.model.named_parameters())
    in_optimizer = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not in_optimizer & {id(params[n]) for n in frozen}
    for name in frozen:
        assert torch.equal(params[name], snapshot.before[name]), name
    assert not torch.equal(params["model.norm.weight"], snapshot.before["model.norm.weight"])
