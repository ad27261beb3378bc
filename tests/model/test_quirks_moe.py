"""Routing and MoE quirks, each against a per-token re-statement of contract section 3.4."""

from __future__ import annotations

import math

import torch
from lumina_reference import moe as reference_moe
from lumina_reference import route as reference_route

from lumina.model import LuminaConfig, MoE, SigmoidRouter

# 16 experts in 4 groups of 4: the group score (top-2 sum) differs from max / full-sum scoring
ROUTER_CFG = dict(num_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4)


def _router(seed: int = 0, **overrides: object) -> SigmoidRouter:
    cfg = LuminaConfig.tiny(**{**ROUTER_CFG, **overrides})
    torch.manual_seed(seed)
    return SigmoidRouter(cfg)


def test_router_selection_with_a_large_bias_matches_the_group_limited_rule() -> None:
    router = _router()
    x = torch.randn(200, router.weight.shape[1])
    with torch.no_grad():
        router.expert_bias.copy_(torch.linspace(-0.4, 0.4, 16)[torch.randperm(16)])
    got = router(x)
    cfg = LuminaConfig.tiny(**ROUTER_CFG)
    logits, ids, weights = reference_route(x, router.weight, router.expert_bias, cfg)
    assert torch.equal(got.topk_ids, ids)
    torch.testing.assert_close(got.topk_weights, weights, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.logits, logits)
    unbiased = router.select(torch.sigmoid(got.logits))
    changed = (unbiased.sort(1).values != got.topk_ids.sort(1).values).any(1)
    assert changed.float().mean() > 0.5  # the bias changes the selection for most tokens


def test_router_weights_come_from_unbiased_scores_times_scaling_factor() -> None:
    router = _router(routed_scaling_factor=2.5)
    x = torch.randn(50, router.weight.shape[1])
    with torch.no_grad():
        router.expert_bias.copy_(torch.randn(16))
    got = router(x)
    s = torch.sigmoid(x @ router.weight.T).gather(1, got.topk_ids)
    torch.testing.assert_close(got.topk_weights, s / s.sum(1, keepdim=True) * 2.5)
    biased = s + router.expert_bias[got.topk_ids]
    assert not torch.allclose(got.topk_weights, biased / biased.sum(1, keepdim=True) * 2.5)
    assert got.topk_weights.dtype == torch.float32


def test_top1_weight_is_the_score_times_the_scaling_factor_without_normalisation() -> None:
    """The official gate normalises only when k > 1: a top-1 weight is sigmoid(logit) * 2.5, not 2.5."""
    router = _router(num_experts_per_tok=1, routed_scaling_factor=2.5)
    with torch.no_grad():
        router.weight.zero_()
        router.weight[5, 0] = 1.0  # logit of expert 5 = x[0]; every other logit 0
        router.expert_bias.copy_(torch.zeros(16).index_fill(0, torch.tensor([5]), 1.0))  # select expert 5
    x = torch.zeros(3, router.weight.shape[1])
    x[:, 0] = torch.tensor([0.0, 2.0, -1.0])
    got = router(x)
    assert got.topk_ids.tolist() == [[5], [5], [5]]
    want = torch.tensor([[0.5], [1 / (1 + math.exp(-2.0))], [1 / (1 + math.exp(1.0))]]) * 2.5
    torch.testing.assert_close(got.topk_weights, want)
    cfg = LuminaConfig.tiny(**{**ROUTER_CFG, "num_experts_per_tok": 1, "routed_scaling_factor": 2.5})
    _, ref_ids, ref_weights = reference_route(x, router.weight, router.expert_bias, cfg)  # its k = 1 branch
    assert torch.equal(ref_ids, got.topk_ids)
    torch.testing.assert_close(ref_weights, want)


def test_group_score_is_the_sum_of_the_two_best_biased_scores() -> None:
    """Hand-made token, logits 0 (sigmoid 0.5), selection driven by the bias. Group scores: top-2 sum picks
    group 1 (1.05), max would pick group 0, full sum group 2."""
    router = _router(topk_group=1, num_experts_per_tok=2)
    wanted = torch.tensor([0.9, 0.1, 0.1, 0.1,  0.55, 0.5, 0.0, 0.0,  0.6, 0.3, 0.3, 0.3,  0.0, 0.0, 0.0, 0.0])
    with torch.no_grad():
        router.weight.zero_()
        router.expert_bias.copy_(wanted - 0.5)
    got = router(torch.randn(1, router.weight.shape[1]))
    assert sorted(got.topk_ids[0].tolist()) == [4, 5]
    torch.testing.assert_close(got.topk_weights[0], torch.tensor([1.25, 1.25]))  # 0.5 / (0.5 + 0.5) * 2.5


def test_experts_are_taken_only_inside_the_kept_groups_even_with_negative_scores() -> None:
    router = _router(topk_group=1, num_experts_per_tok=2)
    biased = torch.tensor([-0.1, -0.2, -5.0, -5.0] + [-9.0] * 12)
    with torch.no_grad():
        router.weight.zero_()
        router.expert_bias.copy_(biased - 0.5)
    got = router(torch.randn(3, router.weight.shape[1]))
    assert got.topk_ids.tolist() == [[0, 1]] * 3


def test_router_runs_in_fp32_on_bf16_activations() -> None:
    router = _router().bfloat16()
    assert router.weight.dtype == torch.bfloat16 and router.expert_bias.dtype == torch.float32
    x = torch.randn(64, router.weight.shape[1]).bfloat16()
    got = router(x)
    assert got.logits.dtype == torch.float32
    assert torch.equal(got.logits, x.float() @ router.weight.float().T)
    assert not torch.equal(got.logits, (x @ router.weight.T).float())


def test_moe_is_weighted_routed_experts_plus_unweighted_shared_expert() -> None:
    cfg = LuminaConfig.tiny(**ROUTER_CFG, num_shared_experts=2)
    torch.manual_seed(0)
    moe = MoE(cfg).double()
    with torch.no_grad():
        moe.gate.expert_bias.copy_(0.3 * torch.randn(16))
    x = torch.randn(2, 7, cfg.hidden_size, dtype=torch.float64)
    y, routing = moe(x)
    sd = {"m." + k: v.double() if v.is_floating_point() else v for k, v in moe.state_dict().items()}
    want, ids = reference_moe(x.reshape(14, -1), sd, "m.", cfg)
    assert sd["m.shared_experts.gate_proj.weight"].shape == (2 * cfg.moe_intermediate_size, cfg.hidden_size)
    assert torch.equal(routing.topk_ids, ids)
    torch.testing.assert_close(y.reshape(14, -1), want, rtol=1e-5, atol=1e-6)


def test_shared_expert_exists_iff_num_shared_experts_is_not_none() -> None:
    assert MoE(LuminaConfig.tiny(num_shared_experts=None)).shared_experts is None
    zero = MoE(LuminaConfig.tiny(num_shared_experts=0)).shared_experts
    assert zero is not None and zero.gate_proj.weight.shape == (0, 64)  # only `is not None` is checked
