"""Rollouts (G samples per prompt, keyed streams) and one post-training step outside the Trainer."""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext

import pytest
import torch
from toy_rewards import low_codes, short_answer

from lumina.contract.schema import Text
from lumina.generation.sequences import Prompt
from lumina.post_training.losses.grpo import GRPO
from lumina.post_training.mode import PostTraining, PostTrainingConfig
from lumina.post_training.prompts import PromptBatch
from lumina.post_training.rewards import Rewards
from lumina.post_training.rollout import RolloutConfig, rollout
from lumina.post_training.samples import RLPrompt

CONFIG = RolloutConfig(group_size=3, temperature=1.0, image_steps=3, text_length=4, block_length=2, text_steps=2)


def _prompts():
    return [RLPrompt(Prompt([Text([20, 21])], key="img", grid=(2, 2)), "t2i"),
            RLPrompt(Prompt([Text([22, 23, 24])], key="txt"), "text_qa")]


def test_g_samples_per_prompt_from_keyed_streams(tiny_model, tokens):
    tiny_model.train()
    first = rollout(tiny_model, _prompts(), CONFIG, tokens, step=0)
    assert tiny_model.training  # the mode is restored after sampling in eval mode
    assert [c.group for c in first] == [0, 0, 0, 1, 1, 1]
    assert [c.is_image for c in first] == [True] * 3 + [False] * 3
    assert all(len(c.ids) == 4 and c.block_length == 2 for c in first[3:])
    assert len({tuple(c.codes.flatten().tolist()) for c in first[:3]}) == 3  # G distinct pictures
    again = rollout(tiny_model, list(reversed(_prompts())), CONFIG, tokens, step=0)  # other order, same draws
    assert torch.equal(again[3].codes, first[0].codes) and again[0].ids == first[3].ids
    later = rollout(tiny_model, _prompts(), CONFIG, tokens, step=1)
    assert not torch.equal(later[0].codes, first[0].codes)  # the next step draws anew
    with pytest.raises(ValueError, match="rollout.temperature=0"):
        RolloutConfig(temperature=0)


def test_vrpo_scores_policy_and_reference_on_shared_masks(tiny_model, tokens):
    """With the reference equal to the policy every pair's margin is exactly 0 (loss log 2), however noisy each
    MC estimate is: the antithetic sharing of VRPO."""
    mode = PostTraining(PostTrainingConfig(term={"name": "vrpo", "beta": 1.0},
                                           estimators={"text": "blockwise", "image": "remask"}),
                        CONFIG, Rewards({"t2i": low_codes, "text_qa": short_answer}))
    batch = PromptBatch(0, _prompts(), tokens, ("t2i", "text_qa"))
    loss, metrics = mode.step(tiny_model, nullcontext(copy.deepcopy(tiny_model)), batch, step=0)
    pairs = 2 - metrics["zero_variance_share"].item() * 2
    assert pairs >= 1
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["margin"].item() == 0.0


class _GRPOReadingAll(GRPO):
    """GRPO scoring every completion, as before `reads`: the reference for what skipping must not change."""

    def reads(self, rewards, groups):
        return torch.ones(len(rewards), dtype=torch.bool)


def test_grpo_scores_only_the_groups_it_keeps_and_its_loss_and_gradients_do_not_change(tiny_model, tokens):
    """A group of equal rewards (every text answer gets 1) is never scored: fewer labelled rows reach the model,
    and the loss and every gradient equal those of scoring all completions."""
    rewards = Rewards({"t2i": low_codes, "text_qa": lambda prompt, sample: 1.0})
    batch = PromptBatch(0, _prompts(), tokens, ("t2i", "text_qa"))
    results = []
    for term in (None, _GRPOReadingAll()):
        model = copy.deepcopy(tiny_model)
        mode = PostTraining(PostTrainingConfig(estimators={"text": "coupled", "image": "remask"}), CONFIG, rewards)
        if term is not None:
            mode.term = term
        rows: list[int] = []
        loss, metrics = mode.step(model, None, batch, step=0,
                                  on_output=lambda out, b, rows=rows: rows.append(int((b.labels != -100).any(-1).sum())))
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                        if p.grad is not None}, sum(rows), metrics))
    (loss, grads, rows, metrics), (loss_all, grads_all, rows_all, _) = results
    assert metrics["zero_variance_share"].item() == 0.5  # the text group; the picture group has spread
    assert 0 < rows < rows_all
    assert torch.allclose(loss, loss_all, atol=1e-7)
    assert grads.keys() == grads_all.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.allclose(grad, grads_all[name], atol=1e-6), name


def test_a_step_whose_groups_all_have_equal_rewards_scores_nothing_and_still_backpropagates(tiny_model, tokens):
    """Nothing to read: one empty forward keeps the loss in the graph (every rank runs the same modules), and
    no weight gets a gradient."""
    mode = PostTraining(PostTrainingConfig(estimators={"text": "coupled", "image": "remask"}), CONFIG,
                        Rewards({"t2i": lambda prompt, sample: 0.0, "text_qa": lambda prompt, sample: 1.0}))
    rows: list[int] = []
    loss, metrics = mode.step(tiny_model, None, PromptBatch(0, _prompts(), tokens, ("t2i", "text_qa")), step=0,
                              on_output=lambda out, b: rows.append(int((b.labels != -100).any(-1).sum())))
    assert metrics["zero_variance_share"].item() == 1.0
    assert rows == [1]  # the one dummy slot, weighted 0
    loss.backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)
    tiny_model.zero_grad(set_to_none=True)
