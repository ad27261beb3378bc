"""The router's training-only parts: the selection noise (noisy top-k) and the `router_init` choice."""

from __future__ import annotations

import math

import pytest
import torch

from lumina.model import LuminaConfig, LuminaModel, MoERouter, PackRows, SigmoidRouter
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

# 8 experts in 4 groups of 2, top-2 groups, top-2 experts (the tiny model's routing)
ROUTER_CFG = dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2)


def _router(**overrides: object) -> SigmoidRouter:
    torch.manual_seed(0)
    return SigmoidRouter(LuminaConfig.tiny(**{**ROUTER_CFG, **overrides}))


def test_noise_spreads_identical_tokens_in_training_only() -> None:
    router = _router()
    x = torch.randn(1, router.weight.shape[1]).expand(512, -1)  # one input, 512 times
    router.set_selection_noise(0.05)
    with torch.no_grad():  # bias the experts near a tie, as the bias update does
        scores = torch.sigmoid(x[:1] @ router.weight.T)[0]
        router.expert_bias.copy_(scores.mean() - scores)
    router.eval()
    plain = router(x)
    assert len({tuple(row) for row in plain.topk_ids.sort(1).values.tolist()}) == 1  # all tokens alike
    router.train()
    noisy = router(x)
    counts = torch.bincount(noisy.topk_ids.reshape(-1), minlength=8)
    assert (counts > 0).all() and counts.max() < 3 * counts.float().mean()
    # the weights are the unbiased, noise-free scores at whatever was selected
    s = torch.sigmoid(x @ router.weight.T).gather(1, noisy.topk_ids)
    torch.testing.assert_close(noisy.topk_weights, s / s.sum(1, keepdim=True) * router.routed_scaling_factor)


def test_noise_is_off_by_default_and_set_by_the_objective() -> None:
    model = LuminaModel(LuminaConfig.tiny())
    routers = [m for m in model.modules() if isinstance(m, MoERouter)]
    assert routers and all(r.selection_noise == 0.0 for r in routers)
    x = torch.randn(64, model.config.hidden_size)
    assert torch.equal(routers[0](x).topk_ids, routers[0](x).topk_ids)  # training mode, no noise: repeatable
    objective = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(selection_noise=0.03)))
    assert objective.configure_routers(model) == model.config.num_moe_layers
    assert all(r.selection_noise == 0.03 for r in routers)


def test_router_init_normal_uses_initializer_range() -> None:
    official = _router().weight.detach()
    bound = 1 / math.sqrt(official.shape[1])  # kaiming_uniform(a=sqrt(5)), the default: std bound / sqrt(3)
    assert float(official.abs().max()) <= bound and float(official.std()) == pytest.approx(bound / math.sqrt(3),
                                                                                          rel=0.1)
    normal = _router(router_init="normal", initializer_range=0.01).weight.detach()
    assert float(normal.std()) == pytest.approx(0.01, rel=0.1) and abs(float(normal.mean())) < 0.002
    assert "router_init" not in LuminaConfig.tiny(router_init="normal").to_hf()  # a training choice only


def test_bad_router_init_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"LuminaConfig\.router_init='xavier'"):
        LuminaConfig.tiny(router_init="xavier")


def test_score_function_names_the_router() -> None:
    model = LuminaModel(LuminaConfig.tiny())
    assert all(type(moe.gate) is SigmoidRouter for moe in model.moe_layers())  # "sigmoid", the official one
    with pytest.raises(ValueError, match=r"LuminaConfig\.score_function='tanh': no router of that name"):
        LuminaModel(LuminaConfig.tiny(score_function="tanh"))
    own = LuminaModel(LuminaConfig.tiny(score_function="lumina.model.routers.sigmoid.SigmoidRouter"))
    assert all(type(moe.gate) is SigmoidRouter for moe in own.moe_layers())  # a dotted path to a class


def test_the_noise_of_a_window_is_its_rows_of_the_packs_draw() -> None:
    """The pack rows reach the router through its forward: a window of rows 2..5 of a 6-row pack draws the
    same noise for its rows as the whole pack does."""
    router = _router()
    router.set_selection_noise(1.0)
    x = torch.randn(6, router.weight.shape[1])
    torch.manual_seed(5)
    whole = router(x, PackRows(0, 6)).topk_ids
    torch.manual_seed(5)
    window = router(x[2:], PackRows(2, 6)).topk_ids
    assert torch.equal(window, whole[2:])
    torch.manual_seed(5)
    assert not torch.equal(router(x[2:], PackRows(0, 6)).topk_ids, whole[2:])  # other rows of the draw
    with pytest.raises(ValueError, match=r"pack rows \(4, 6\) do not hold 4 routed rows"):
        router(x[2:], PackRows(4, 6))
