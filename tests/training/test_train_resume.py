"""Exact resume: 4 optimizer steps straight equal 2 steps + a restart in a new process + 2 steps, with
gradient accumulation 2, the expert-bias update on and distinct batches (losses, weights, expert_bias)."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from safetensors.torch import load_file
from train_helpers import run_cli, small_data

from lumina.attention import resolve_backend

COMMON = ["experiment=debug", "trainer.accumulate_grad_batches=2", "trainer.limit_val_batches=0",
          "callbacks.checkpoint.every_n_train_steps=2", "callbacks.progress_bar=null",
          "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=csv",
          "callbacks.expert_usage.heatmap_every_n_steps=2", "objective.balance.bias_update=true",
          "objective.balance.bias_rate=0.01", *small_data(num_samples=40)]


def losses_by_process(run_dir: Path) -> list[dict[int, float]]:
    """train/loss by optimizer step, one dict per process (each writes its own CSV version)."""
    out = []
    for version in range(len(list((run_dir / "csv").glob("version_*")))):
        rows = csv.DictReader((run_dir / "csv" / f"version_{version}" / "metrics.csv").open())
        out.append({int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")})
    return out


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted((run_dir / "hf").glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def test_two_plus_two_steps_in_two_processes_equal_four_steps(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    a = run_cli([*COMMON, f"hydra.run.dir={straight}", "trainer.max_steps=4"], cwd=tmp_path)
    assert a.returncode == 0, a.stderr[-3000:]
    # the run log names the attention backend that the default attn_backend=auto chose
    assert f"attention backend: {resolve_backend('auto')} (attn_backend=auto)" in (straight / "train.log").read_text()
    b1 = run_cli([*COMMON, f"hydra.run.dir={resumed}", "trainer.max_steps=2"], cwd=tmp_path)
    assert b1.returncode == 0, b1.stderr[-3000:]
    assert (resumed / "checkpoints" / "last.ckpt").is_file()
    b2 = run_cli([*COMMON, f"hydra.run.dir={resumed}", "trainer.max_steps=4"], cwd=tmp_path)
    assert b2.returncode == 0, b2.stderr[-3000:]

    [straight_losses] = losses_by_process(straight)
    first, second = losses_by_process(resumed)
    assert sorted(straight_losses) == [0, 1, 2, 3]
    # the second process really resumed: it trained steps 2 and 3 only
    assert sorted(first) == [0, 1] and sorted(second) == [2, 3]
    resumed_losses = {**first, **second}
    # distinct batches: no two steps saw the same loss
    assert len({round(v, 6) for v in straight_losses.values()}) == 4
    for step in range(4):
        assert resumed_losses[step] == straight_losses[step], f"step {step}"

    wa, wb = weights(straight), weights(resumed)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    biases = [k for k in wa if k.endswith("expert_bias")]
    assert biases and all(wa[k].abs().sum() > 0 for k in biases)  # the bias update ran
