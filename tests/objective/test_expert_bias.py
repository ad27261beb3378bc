"""Sign-rule expert-bias update: direction, zero mean, invalid tokens excluded, applied once per step."""

from __future__ import annotations

import pytest
import torch
from objective_helpers import HandOutput, make_batch
from torch import nn

from lumina.model import LuminaConfig, LuminaOutput, MoERouter, SigmoidRouter
from lumina.objective import (
    BalanceConfig,
    LuminaObjective,
    ObjectiveConfig,
    find_expert_biases,
    sign_rule_update,
)

E = 4
ROUTER_CONFIG = LuminaConfig.tiny(num_experts=E, n_group=1, topk_group=1, num_experts_per_tok=2)


class NoBiasRouter(MoERouter):
    """A user's router that declares no expert bias (the base class's `selection_bias`)."""


class Layer(nn.Module):
    def __init__(self, router: type[MoERouter]) -> None:
        super().__init__()
        self.mlp = nn.Module()
        self.mlp.gate = router(ROUTER_CONFIG)


class Routers(nn.Module):
    """Two MoE layers with a router at `mlp.gate`, like the model."""

    def __init__(self, router: type[MoERouter] = SigmoidRouter) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(router), Layer(router)])


def test_sign_rule_on_a_hand_load() -> None:
    load = torch.tensor([[10.0, 2.0, 4.0, 0.0]])  # mean 4
    update = sign_rule_update(load, rate=0.1)
    # rate * sign(4 - load) = [-0.1, 0.1, 0, 0.1]; its mean 0.025 is subtracted
    assert update.tolist()[0] == pytest.approx([-0.125, 0.075, -0.025, 0.075])
    assert update.sum().item() == pytest.approx(0.0, abs=1e-7)


def test_find_expert_biases_in_module_order() -> None:
    model = Routers()
    biases = find_expert_biases(model)
    assert len(biases) == 2
    assert biases[0] is model.layers[0].mlp.gate.expert_bias
    assert biases[1] is model.layers[1].mlp.gate.expert_bias


def test_a_router_without_an_expert_bias_is_refused_naming_it() -> None:
    model = Routers(NoBiasRouter)
    with pytest.raises(ValueError, match=r"router 'layers.0.mlp.gate' \(.*NoBiasRouter\) has none"):
        find_expert_biases(model)
    objective = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=True)))
    with pytest.raises(ValueError, match=r"bias_update=true needs an expert bias.*NoBiasRouter"):
        objective.configure_routers(model)  # refused when the run is built, before any step
    off = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)))
    assert off.configure_routers(model) == 2


def routed(topk: list[list[int]], valid: list[bool]) -> tuple[LuminaOutput, object]:
    """One micro-batch whose two layers route identically."""
    ids = torch.tensor([topk])
    out = HandOutput(text_logits=torch.zeros(0, 5), text_rows=torch.zeros(0, dtype=torch.long),
                     image_logits=torch.zeros(0, 2, 3), image_rows=torch.zeros(0, dtype=torch.long),
                     router_logits=[torch.zeros(1, len(topk), E)] * 2, router_topk_ids=[ids, ids])
    batch = make_batch([1] * len(topk), torch.full((1, len(topk), 2), -100), token_valid=valid)
    return out, batch


def test_update_applies_only_at_the_optimizer_step_with_accumulated_counts() -> None:
    model = Routers()
    objective = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=True, bias_rate=0.5)))
    # micro-batch 1 loads expert 0 (and 1); micro-batch 2 loads expert 2 heavily.
    # Valid-token totals: expert 0: 2, expert 1: 2, expert 2: 4, expert 3: 0 -> mean 2.
    # The padding token of micro-batch 1 picks expert 3 twice and must not count.
    objective(*routed([[0, 1], [0, 1], [3, 3]], [True, True, False]))
    assert [b.tolist() for b in find_expert_biases(model)] == [[0.0] * E] * 2  # not yet applied
    objective(*routed([[2, 2], [2, 2]], [True, True]))
    assert [b.tolist() for b in find_expert_biases(model)] == [[0.0] * E] * 2
    update = objective.on_optimizer_step(model)
    # sign(2 - load) = [0, 0, -1, +1] -> * 0.5, mean 0 -> [0, 0, -0.5, 0.5]
    for bias in find_expert_biases(model):
        assert bias.tolist() == pytest.approx([0.0, 0.0, -0.5, 0.5])
        assert bias.sum().item() == pytest.approx(0.0, abs=1e-7)
    assert update.shape == (2, E)
    # counts were reset: a second step without micro-batches changes nothing
    assert objective.on_optimizer_step(model) is None
    assert find_expert_biases(model)[0].tolist() == pytest.approx([0.0, 0.0, -0.5, 0.5])


def test_overloaded_expert_goes_down_and_underloaded_up() -> None:
    model = Routers()
    objective = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_rate=0.01)))
    objective(*routed([[0, 1], [0, 2], [0, 1], [0, 1]], [True] * 4))  # loads [4, 3, 1, 0], mean 2
    objective.on_optimizer_step(model)
    bias = find_expert_biases(model)[0]
    assert bias[0] < 0 and bias[1] < 0 and bias[2] > 0 and bias[3] > 0
    assert bias.sum().item() == pytest.approx(0.0, abs=1e-9)


def test_eval_mode_and_switched_off_update_do_not_accumulate() -> None:
    model = Routers()
    objective = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=True))).eval()
    objective(*routed([[0, 1], [0, 1]], [True, True]))
    assert objective.on_optimizer_step(model) is None
    off = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)))
    off(*routed([[0, 1], [0, 1]], [True, True]))
    assert off.on_optimizer_step(model) is None
    assert find_expert_biases(model)[0].tolist() == [0.0] * E
