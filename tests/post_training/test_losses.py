"""The loss terms against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from lumina.post_training.losses import LOSS_TERMS, LossInputs, build_loss_term

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
TOKENS = torch.tensor([2.0, 4.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0])


def _inputs(**extra) -> LossInputs:
    logp = torch.tensor([-2.0, -8.0, -1.5, -3.0, -6.0, -3.0, -9.0, -1.0], requires_grad=True)
    return LossInputs(logp=logp, rewards=REWARDS, groups=GROUPS, num_tokens=TOKENS, **extra)


def test_grpo_on_policy_gradient_is_the_advantage_over_tokens_and_drops_zero_variance_groups():
    inputs = _inputs()
    out = build_loss_term("grpo", "objective.term")(inputs)
    out.loss.backward()
    # group 0: mean 0.5, A = +-0.5, no std scaling; 4 kept completions; group 1 has equal rewards: dropped
    want = torch.tensor([-0.5 / 2, 0.5 / 4, 0.5 / 1, -0.5 / 2, 0, 0, 0, 0]) / 4
    assert torch.allclose(inputs.logp.grad, want)
    assert out.loss.item() == pytest.approx(0.0, abs=1e-7)  # ratio 1, advantages sum to 0
    assert out.metrics["zero_variance_share"].item() == 0.5
    assert out.metrics["clip_fraction"].item() == 0.0


def test_grpo_std_scaling_divides_by_the_group_std():
    inputs = _inputs()
    build_loss_term({"name": "grpo", "scale_std": True}, "t")(inputs).loss.backward()
    assert inputs.logp.grad[0].item() == pytest.approx(-0.5 / (0.5 + 1e-4) / 2 / 4, rel=1e-6)


def test_grpo_clips_the_ratio_to_the_old_policy():
    # completion 0 (A = +0.5) is 0.5 nats per token above its old value: ratio e^0.5 > 1.2, clipped, no gradient;
    # completion 1 (A = -0.5) at ratio e^0.5: min picks the unclipped -0.5 e^0.5, which keeps its gradient
    logp = _inputs().logp.detach()
    old = logp.clone()
    old[0] -= 0.5 * TOKENS[0]
    old[1] -= 0.5 * TOKENS[1]
    inputs = _inputs(old_logp=old)
    out = build_loss_term({"name": "grpo", "clip_eps": 0.2}, "t")(inputs)
    out.loss.backward()
    assert inputs.logp.grad[0].item() == 0.0
    assert inputs.logp.grad[1].item() == pytest.approx(0.5 * math.exp(0.5) / 4 / 4, rel=1e-6)
    assert out.metrics["clip_fraction"].item() == pytest.approx(1 / 4)
    want = -(1.2 * 0.5 - 0.5 * math.exp(0.5) - 0.5 + 0.5) / 4
    assert out.loss.item() == pytest.approx(want, rel=1e-6)


def test_grpo_k3_kl_to_the_reference():
    ref = _inputs().logp.detach().clone()
    ref[0] += 0.2 * TOKENS[0]  # completion 0: l_ref - l = 0.2 per token
    inputs = _inputs(ref_logp=ref)
    term = build_loss_term({"name": "grpo", "kl_coef": 0.5}, "t")
    assert term.needs_reference()
    out = term(inputs)
    k3 = math.exp(0.2) - 0.2 - 1
    assert out.metrics["kl"].item() == pytest.approx(k3 / 8, rel=1e-5)  # over every completion
    assert out.loss.item() == pytest.approx(0.5 * k3 / 8, rel=1e-5)
    with pytest.raises(ValueError, match="ref_logp"):
        term(_inputs())


def test_wd1_weights_are_the_softmax_of_plus_and_minus_the_advantage():
    inputs = _inputs()
    out = LOSS_TERMS.build("wd1", "t")(inputs)
    out.loss.backward()
    a = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64)
    w = (torch.softmax(a, 0) - torch.softmax(-a, 0)).float()
    want = torch.cat([-w / TOKENS[:4], torch.zeros(4)])  # one kept group
    assert torch.allclose(inputs.logp.grad, want, atol=1e-7)
    assert out.metrics["zero_variance_share"].item() == 0.5


def test_vrpo_is_dpo_on_the_best_and_worst_of_each_group():
    ref = torch.tensor([-1.0, -7.0, -2.0, -3.5, -6.0, -3.0, -9.0, -1.0])
    inputs = _inputs(ref_logp=ref)
    out = build_loss_term({"name": "vrpo", "beta": 0.5}, "t")(inputs)
    out.loss.backward()
    # group 0: winner = first max (0), loser = first min (1); group 1: no pair
    margin = 0.5 * ((-2.0 + 1.0) - (-8.0 + 7.0))
    assert out.loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-margin))), rel=1e-6)
    sig = 1 / (1 + math.exp(margin))
    want = torch.zeros(8)
    want[0], want[1] = -0.5 * sig, 0.5 * sig
    assert torch.allclose(inputs.logp.grad, want, atol=1e-7)
    assert out.metrics["zero_variance_share"].item() == 0.5


def test_self_distill_trains_only_on_accepted_samples():
    inputs = _inputs()
    out = build_loss_term({"name": "self_distill", "threshold": 1.0}, "t")(inputs)
    out.loss.backward()
    want = torch.zeros(8)
    want[0], want[3] = -1 / 2 / 2, -1 / 2 / 2
    assert torch.allclose(inputs.logp.grad, want)
    assert out.metrics["accepted_share"].item() == 0.25


@pytest.mark.parametrize(("spec", "read"), [
    ("grpo", [0, 1, 2, 3]),                              # the group whose rewards differ
    ({"name": "grpo", "kl_coef": 0.1}, list(range(8))),  # the KL's mean runs over every completion
    ("wd1", [0, 1, 2, 3]),
    ("vrpo", [0, 1]),                                    # the first best and first worst of group 0
    ("self_distill", [0, 3]),                            # the accepted samples
])
def test_each_term_reads_only_the_completions_its_loss_uses(spec, read):
    reads = build_loss_term(spec, "t").reads(REWARDS, GROUPS)
    assert reads.nonzero().squeeze(1).tolist() == read


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="objective.term.name='nope'"):
        build_loss_term("nope", "objective.term")
    with pytest.raises(ValueError, match="clip_eps=0"):
        build_loss_term({"name": "grpo", "clip_eps": 0}, "objective.term")
    with pytest.raises(ValueError, match="objective.term: WD1.. takes no arguments"):
        build_loss_term({"name": "wd1", "beta": 1}, "objective.term")
