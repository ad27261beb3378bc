"""GRPO on 2 gloo ranks (FSDP2, expert parallelism 2) logs the losses and trains the weights of one process on
the same rollouts: each rank rolls out half of the step's prompts (the same global draw), the normalisers are
global, and the ranks stay in lockstep through sampling and scoring. VRPO on LoRA adapters, whose reference is
the base with the adapters off (no copy of the model), does the same."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rl_helpers import TINY_ROLLOUT
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
COMMON = ["objective=grpo", "objective.post_training.inner_epochs=2", "logger=csv", "trainer.max_steps=4",
          "callbacks.progress_bar=null", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
          "optim.lr=3e-3", "rollout.prompts.mix={t2i: 1.0, edit: 0.0, vqa: 0.0, text_qa: 1.0}", "~reward",
          "+reward.t2i={_target_: toy_rewards.low_codes, _partial_: true}",
          "+reward.text_qa={_target_: toy_rewards.short_answer, _partial_: true}", *TINY_ROLLOUT]


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "lumina.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _logged(run_dir: Path, key: str) -> list[float]:
    (metrics,) = run_dir.glob("csv/*/metrics.csv")
    return [float(r[key]) for r in csv.DictReader(metrics.open()) if r.get(key)]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted((run_dir / "hf").glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def test_grpo_on_two_ranks_with_ep2_equals_one_process(tmp_path: Path) -> None:
    one = _train([*COMMON, "rollout.prompts_per_step=4", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train([*COMMON, "rollout.prompts_per_step=2", "strategy=fsdp_ep", "trainer.devices=2",
                  "strategy.parallel.ep=2", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    for key in ("train/loss", "rl/t2i/reward", "rl/text_qa/reward", "rl/clip_fraction", "rl/zero_variance_share"):
        want, got = _logged(tmp_path / "one", key), _logged(tmp_path / "two", key)
        assert len(want) == 4 and got == pytest.approx(want, abs=1e-5), key
    losses = _logged(tmp_path / "one", "train/loss")
    assert losses[1] != 0 and losses[3] != 0  # the inner epochs' ratios move off 1: real losses, not zeros
    want, got = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert want.keys() == got.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_vrpo_on_lora_two_ranks_with_ep2_equals_one_process(tmp_path: Path) -> None:
    vrpo = ["objective=vrpo", "adapter=lora", "adapter.rank=4", "trainer.max_steps=3",
            *[a for a in COMMON if not a.startswith(("objective", "trainer.max_steps"))]]
    one = _train([*vrpo, "rollout.prompts_per_step=4", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train([*vrpo, "rollout.prompts_per_step=2", "strategy=fsdp_ep", "trainer.devices=2",
                  "strategy.parallel.ep=2", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    margins = _logged(tmp_path / "one", "rl/margin")
    assert margins[0] == 0 and margins[-1] != 0  # policy = reference (B = 0) at the start, apart after a step
    # a margin is beta x a difference of fp32 sums of whole answers' log-likelihoods: equal to ~1e-4 relative
    for key in ("train/loss", "rl/margin", "rl/pair_accuracy", "rl/t2i/reward"):
        want, got = _logged(tmp_path / "one", key), _logged(tmp_path / "two", key)
        assert len(want) == 3 and got == pytest.approx(want, rel=1e-4, abs=1e-5), key
