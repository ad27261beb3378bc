"""Load-balance loss on a hand-built routing, both P sources, invalid tokens excluded."""

from __future__ import annotations

import math

import pytest
import torch
from objective_helpers import HandOutput, make_batch

from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig, balance_loss, expert_load

E, K = 4, 2
LOGITS = [[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, -2.0, 0.0], [-1.0, 3.0, 0.0, 1.0], [9.0, 9.0, -9.0, 4.0]]
TOPK = [[3, 0], [0, 1], [1, 3], [0, 1]]
VALID = [True, True, True, False]  # token 3 is padding


def naive_loss(logits: list[list[float]], topk: list[list[int]], valid: list[bool], p_source: str) -> float:
    tokens = [i for i, v in enumerate(valid) if v]
    counts = [0] * E
    for i in tokens:
        for e in topk[i]:
            counts[e] += 1
    f = [c / (len(tokens) * K) for c in counts]
    p_mean = [0.0] * E
    for i in tokens:
        if p_source == "softmax":
            w = [math.exp(z) for z in logits[i]]
        else:
            w = [1 / (1 + math.exp(-z)) for z in logits[i]]
        for e in range(E):
            p_mean[e] += w[e] / sum(w) / len(tokens)
    return E * sum(fe * pe for fe, pe in zip(f, p_mean, strict=True))


def official_softmax_loss(logits: list[list[float]], topk: list[list[int]]) -> float:
    """Contract 5.5 on all tokens: P = token-mean softmax, f = bincount(topk) / numel."""
    flat = [e for row in topk for e in row]
    f = [flat.count(e) / len(flat) for e in range(E)]
    p = [sum(math.exp(row[e]) / sum(math.exp(z) for z in row) for row in logits) / len(logits) for e in range(E)]
    return E * sum(a * b for a, b in zip(f, p, strict=True))


def tensors(logits=LOGITS, topk=TOPK, valid=VALID):
    return (torch.tensor([logits], requires_grad=True), torch.tensor([topk]), torch.tensor([valid]))


@pytest.mark.parametrize("p_source", ["sigmoid", "softmax"])
def test_balance_loss_matches_hand_computation(p_source: str) -> None:
    logits, topk, valid = tensors()
    got = balance_loss([logits], [topk], valid, p_source)
    assert got.item() == pytest.approx(naive_loss(LOGITS, TOPK, VALID, p_source), rel=1e-6)
    got.backward()
    assert logits.grad[0, 3].abs().sum().item() == 0.0  # the padding token gets no gradient
    assert logits.grad[0, :3].abs().sum().item() > 0.0


def test_softmax_variant_reproduces_the_official_function_when_all_tokens_valid() -> None:
    logits, topk, _ = tensors()
    got = balance_loss([logits], [topk], torch.ones(1, 4, dtype=torch.bool), "softmax")
    assert got.item() == pytest.approx(official_softmax_loss(LOGITS, TOPK), rel=1e-6)


def test_invalid_tokens_do_not_change_the_loss_or_counts() -> None:
    changed_logits = [row[:] for row in LOGITS]
    changed_logits[3] = [-5.0, 7.0, 7.0, 0.0]
    changed_topk = [row[:] for row in TOPK]
    changed_topk[3] = [2, 2]
    a = balance_loss([tensors()[0]], [tensors()[1]], tensors()[2], "sigmoid")
    b_logits, b_topk, b_valid = tensors(changed_logits, changed_topk)
    b = balance_loss([b_logits], [b_topk], b_valid, "sigmoid")
    assert a.item() == b.item()
    load = expert_load([b_topk], b_valid, E)
    assert load.tolist() == [[2.0, 2.0, 0.0, 2.0]]  # expert 2 is only picked by the padding token


def test_layers_are_averaged() -> None:
    other_logits = [[0.0, 1.0, 2.0, 3.0]] * 4
    other_topk = [[2, 3]] * 4
    l1, t1, valid = tensors()
    l2, t2, _ = tensors(other_logits, other_topk)
    got = balance_loss([l1, l2], [t1, t2], valid, "sigmoid")
    expected = (naive_loss(LOGITS, TOPK, VALID, "sigmoid") + naive_loss(other_logits, other_topk, VALID, "sigmoid")) / 2
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_no_valid_token_gives_a_connected_zero() -> None:
    logits, topk, _ = tensors()
    got = balance_loss([logits], [topk], torch.zeros(1, 4, dtype=torch.bool), "sigmoid")
    assert got.item() == 0.0 and got.grad_fn is not None
    got.backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("p_source", ["sigmoid", "softmax"])
def test_a_single_expert_gives_a_connected_zero_like_the_official_function(p_source: str) -> None:
    # E = 1: f = [1], P = [1], so E * sum f P would be 1; contract 5.5 returns 0 for E <= 1
    logits = torch.tensor([[[0.3], [-1.2], [2.0]]], requires_grad=True)
    got = balance_loss([logits], [torch.zeros(1, 3, 1, dtype=torch.long)], torch.ones(1, 3, dtype=torch.bool),
                       p_source)
    assert got.item() == 0.0 and got.grad_fn is not None


def test_objective_adds_coef_times_balance_loss() -> None:
    logits, topk, _ = tensors()
    out = HandOutput(text_logits=torch.zeros(0, 5), text_rows=torch.zeros(0, dtype=torch.long),
                     image_logits=torch.zeros(0, 2, 3), image_rows=torch.zeros(0, dtype=torch.long),
                     router_logits=[logits], router_topk_ids=[topk])
    batch = make_batch([1, 1, 1, 0], torch.full((1, 4, 2), -100), token_valid=VALID)
    cfg = ObjectiveConfig(balance=BalanceConfig(aux_coef=0.01, p_source="softmax", bias_update=False))
    result = LuminaObjective(cfg)(out, batch)
    expected = 0.01 * naive_loss(LOGITS, TOPK, VALID, "softmax")
    assert result.balance_loss.item() == pytest.approx(expected, rel=1e-6)
    assert result.loss.item() == pytest.approx(expected, rel=1e-6)
    assert result.expert_load.tolist() == [[2.0, 2.0, 0.0, 2.0]]
