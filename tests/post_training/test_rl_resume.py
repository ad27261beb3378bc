"""Resume mid-run: 2 GRPO steps + a restart in a new process + 2 steps equal 4 steps straight (losses, weights):
the rollout streams, the reference model (k3 KL) and the optimizer state travel with the checkpoint. On-policy
(one step per rollout) and with two PPO steps per rollout, resumed at a rollout boundary (as `rl_world`'s
checkpoint interval, a multiple of its inner epochs, places every resume); an interval that is not a multiple
is refused, and a checkpoint saved inside a cycle otherwise resumes with a warning."""

from __future__ import annotations

import csv
import os
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from rl_helpers import TINY_ROLLOUT, compose_train, quiet, run_cli
from safetensors.torch import load_file

from lumina.post_training.mode import PostTrainingConfig
from lumina.training import build
from lumina.training.errors import ConfigError
from lumina.training.run import run

HERE = Path(__file__).resolve().parent
COMMON = ["objective=grpo", "objective.post_training.term.kl_coef=0.5", "logger=csv",
          "callbacks.checkpoint.every_n_train_steps=2", "callbacks.progress_bar=null",
          "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "optim.lr=3e-3",
          "optim.decay_steps=4",
          "rollout.prompts.mix={t2i: 1.0, edit: 0.0, vqa: 0.0, text_qa: 1.0}", "~reward",
          "+reward.t2i={_target_: toy_rewards.low_codes, _partial_: true}",
          "+reward.text_qa={_target_: toy_rewards.short_answer, _partial_: true}", *TINY_ROLLOUT]


def _logged(run_dir: Path, key: str) -> dict[int, float]:
    out = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        out.update({int(r["step"]): float(r[key]) for r in csv.DictReader(metrics.open()) if r.get(key)})
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted((run_dir / "hf").glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


@pytest.mark.parametrize("inner_epochs", [1, 2])
def test_two_plus_two_steps_equal_four_steps(tmp_path, inner_epochs):
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = [*COMMON, f"objective.post_training.inner_epochs={inner_epochs}"]
    a = run_cli([*common, f"hydra.run.dir={straight}", "trainer.max_steps=4"], cwd=tmp_path, env=env)
    assert a.returncode == 0, a.stderr[-3000:]
    b1 = run_cli([*common, f"hydra.run.dir={resumed}", "trainer.max_steps=2"], cwd=tmp_path, env=env)
    assert b1.returncode == 0, b1.stderr[-3000:]
    b2 = run_cli([*common, f"hydra.run.dir={resumed}", "trainer.max_steps=4"], cwd=tmp_path, env=env)
    assert b2.returncode == 0, b2.stderr[-3000:]
    assert len(list(resumed.glob("csv/version_*"))) == 2  # two processes
    for key in ("train/loss", "rl/kl", "rl/t2i/reward", "rl/text_qa/reward", "rl/t2i/reward_spread"):
        want, got = _logged(straight, key), _logged(resumed, key)
        assert sorted(want) == [0, 1, 2, 3] and got == want, key
    # the policy moves and the reference stays the starting weights: KL 0 only at step 0, then growing apart
    kl = _logged(straight, "rl/kl")
    assert kl[0] == 0 and all(kl[s] > 0 for s in (1, 2, 3)) and len(set(kl.values())) == 4
    w_straight, w_resumed = _weights(straight), _weights(resumed)
    assert all(torch.equal(w_straight[k], w_resumed[k]) for k in w_straight)


def test_a_checkpoint_interval_inside_a_rollout_cycle_is_refused(tmp_path):
    """With three PPO steps per rollout a checkpoint every 20 steps would fall inside cycles, whose rollout is
    not saved: refused before training, naming both fields; a timed interval likewise."""
    cfg = compose_train(["objective=grpo", "objective.post_training.inner_epochs=3",
                         "callbacks.checkpoint.every_n_train_steps=20", *quiet(tmp_path), *TINY_ROLLOUT])
    with pytest.raises(ConfigError, match=r"callbacks.checkpoint.every_n_train_steps=20: not a multiple of "
                                          r"objective.post_training.inner_epochs=3"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists()
    config = PostTrainingConfig(inner_epochs=3)
    config.check_checkpoint_interval(30, None, "callbacks.checkpoint")  # a multiple: accepted
    with pytest.raises(ValueError, match="callbacks.checkpoint.train_time_interval"):
        config.check_checkpoint_interval(None, timedelta(minutes=5), "callbacks.checkpoint")
    PostTrainingConfig(inner_epochs=1).check_checkpoint_interval(7, timedelta(minutes=5), "callbacks.checkpoint")


def test_resuming_inside_a_rollout_cycle_warns(tmp_path):
    """A checkpoint saved mid-cycle (a preemption handler's) resumes, but says it is not exact."""
    module = build.module(compose_train(["objective=grpo", "objective.post_training.inner_epochs=2",
                                         *quiet(tmp_path), *TINY_ROLLOUT]))
    with pytest.warns(UserWarning, match="step 3, inside a rollout cycle of objective.post_training.inner_epochs=2"):
        module.on_load_checkpoint({"global_step": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.on_load_checkpoint({"global_step": 4})
