"""The post-training mode inside the LightningModule and Trainer: objective=grpo|wd1|vrpo|self_distill."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import TINY_ROLLOUT, compose_train, quiet

from lumina.objective import find_expert_biases
from lumina.training.run import run


@pytest.mark.parametrize("objective", ["grpo", "wd1", "vrpo", "self_distill"])
def test_each_objective_trains_in_the_trainer(objective, tmp_path):
    cfg = compose_train([f"objective={objective}", "trainer.max_steps=2", *quiet(tmp_path), *TINY_ROLLOUT,
                         "logger=csv"])
    outputs = run(cfg)
    module = outputs.module
    assert outputs.steps == 2 and all(math.isfinite(v) for v in outputs.losses)
    logged = outputs.trainer.logged_metrics
    # the last step's tasks (a task no rank rolled out logs nothing), each with reward, spread and pass@G
    tasks = {key.split("/")[1] for key in logged if key.startswith("rl/") and key.endswith("/reward")}
    assert tasks and tasks <= {"t2i", "edit", "vqa", "text_qa"}
    assert all(f"rl/{t}/pass_at_g" in logged and f"rl/{t}/reward_spread" in logged for t in tasks)
    assert ("rl/clip_fraction" in logged) == (objective == "grpo")
    assert (module.reference is not None) == (objective == "vrpo")
    if objective == "vrpo":  # the reference stays the starting weights while the policy moves
        moved = [not torch.equal(p, r) for p, r in zip(module.model.parameters(), module.reference.parameters(),
                                                      strict=True)]
        assert any(moved) and not any(r.requires_grad for r in module.reference.parameters())
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_expert_bias_stays_frozen_unless_asked(tmp_path):
    def biases(outputs):
        return torch.cat([b.flatten() for b in find_expert_biases(outputs.module.model)])

    frozen = run(compose_train(["objective=grpo", "trainer.max_steps=1", *quiet(tmp_path / "a"), *TINY_ROLLOUT]))
    asked = run(compose_train(["objective=grpo", "trainer.max_steps=1", *quiet(tmp_path / "b"), *TINY_ROLLOUT,
                               "objective.balance.bias_update=true"]))
    assert torch.count_nonzero(biases(frozen)) == 0
    assert torch.count_nonzero(biases(asked)) > 0


def test_routing_replay_runs_in_the_trainer_and_logs_its_divergence(tmp_path):
    """R3 with activation checkpointing and PPO inner epochs: the old-policy pass records the routing."""
    outputs = run(compose_train(["objective=grpo", "trainer.max_steps=2", *quiet(tmp_path), *TINY_ROLLOUT,
                                 "objective.post_training.routing=replay", "objective.post_training.inner_epochs=2",
                                 "model.config.gradient_checkpointing=full"]))
    assert outputs.steps == 2 and all(math.isfinite(v) for v in outputs.losses)
    divergence = outputs.trainer.logged_metrics["rl/routing_divergence"].item()
    assert 0 <= divergence < 1  # the update at epoch 1 routes with moved weights: a share, logged
