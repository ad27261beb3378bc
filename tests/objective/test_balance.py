"""Load-balance loss on a hand-built routing, both P sources (the sigmoid router's own probabilities and the
official softmax), invalid tokens excluded."""

from __future__ import annotations

import math

import pytest
import torch
from objective_helpers import HandOutput, make_batch

from lumina.model import LuminaConfig, SigmoidRouter
from lumina.objective import (
    BalanceConfig,
    LuminaObjective,
    ObjectiveConfig,
    balance_loss,
    expert_load,
    softmax_probs,
)

E, K = 4, 2
LOGITS = [[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, -2.0, 0.0], [-1.0, 3.0, 0.0, 1.0], [9.0, 9.0, -9.0, 4.0]]
TOPK = [[3, 0], [0, 1], [1, 3], [0, 1]]
VALID = [True, True, True, False]  # token 3 is padding
SIGMOID_ROUTER = SigmoidRouter(LuminaConfig.tiny(num_experts=E, n_group=1, topk_group=1, num_experts_per_tok=K))
PROBS = {"sigmoid": SIGMOID_ROUTER.balance_probs, "softmax": softmax_probs}  # naive_loss's names -> P functions


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
    got = balance_loss([logits], [topk], valid, PROBS[p_source])
    assert got.item() == pytest.approx(naive_loss(LOGITS, TOPK, VALID, p_source), rel=1e-6)
    got.backward()
    assert logits.grad[0, 3].abs().sum().item() == 0.0  # the padding token gets no gradient
    assert logits.grad[0, :3].abs().sum().item() > 0.0


def test_softmax_variant_reproduces_the_official_function_when_all_tokens_valid() -> None:
    logits, topk, _ = tensors()
    got = balance_loss([logits], [topk], torch.ones(1, 4, dtype=torch.bool), PROBS["softmax"])
    assert got.item() == pytest.approx(official_softmax_loss(LOGITS, TOPK), rel=1e-6)


def test_invalid_tokens_do_not_change_the_loss_or_counts() -> None:
    changed_logits = [row[:] for row in LOGITS]
    changed_logits[3] = [-5.0, 7.0, 7.0, 0.0]
    changed_topk = [row[:] for row in TOPK]
    changed_topk[3] = [2, 2]
    a = balance_loss([tensors()[0]], [tensors()[1]], tensors()[2], PROBS["sigmoid"])
    b_logits, b_topk, b_valid = tensors(changed_logits, changed_topk)
    b = balance_loss([b_logits], [b_topk], b_valid, PROBS["sigmoid"])
    assert a.item() == b.item()
    load = expert_load([b_topk], b_valid, E)
    assert load.tolist() == [[2.0, 2.0, 0.0, 2.0]]  # expert 2 is only picked by the padding token


def test_layers_are_averaged() -> None:
    other_logits = [[0.0, 1.0, 2.0, 3.0]] * 4
    other_topk = [[2, 3]] * 4
    l1, t1, valid = tensors()
    l2, t2, _ = tensors(other_logits, other_topk)
    got = balance_loss([l1, l2], [t1, t2], valid, PROBS["sigmoid"])
    expected = (naive_loss(LOGITS, TOPK, VALID, "sigmoid") + naive_loss(other_logits, other_topk, VALID, "sigmoid")) / 2
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_no_valid_token_gives_a_connected_zero() -> None:
    logits, topk, _ = tensors()
    got = balance_loss([logits], [topk], torch.zeros(1, 4, dtype=torch.bool), PROBS["sigmoid"])
    assert got.item() == 0.0 and got.grad_fn is not None
    got.backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("p_source", ["sigmoid", "softmax"])
def test_a_single_expert_gives_a_connected_zero_like_the_official_function(p_source: str) -> None:
    # E = 1: f = [1], P = [1], so E * sum f P would be 1; contract 5.5 returns 0 for E <= 1
    logits = torch.tensor([[[0.3], [-1.2], [2.0]]], requires_grad=True)
    got = balance_loss([logits], [torch.zeros(1, 3, 1, dtype=torch.long)], torch.ones(1, 3, dtype=torch.bool),
                       PROBS[p_source])
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


def _routed(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k of sigmoid(logits) [..., E] -> ids [..., k] (the router's rule without groups or bias)."""
    return torch.sigmoid(logits).topk(k, dim=-1).indices


@pytest.mark.parametrize("p_source", ["sigmoid", "softmax"])
@pytest.mark.parametrize("scope", ["batch", "sequence"])
def test_gradient_descent_on_the_balance_loss_moves_load_off_the_overloaded_expert(p_source: str,
                                                                                   scope: str) -> None:
    # 64 tokens, 8 experts, top-2; expert 5 is the first choice of every token (it carries 32 of 128 slots)
    torch.manual_seed(0)
    tokens, experts, k = 64, 8, 2
    logits = (0.3 * torch.randn(1, tokens, experts)).index_add(2, torch.tensor([5]), torch.full((1, tokens, 1), 2.0))
    logits.requires_grad_(True)
    valid = torch.ones(1, tokens, dtype=torch.bool)
    segments = {}
    if scope == "sequence":  # two samples packed
        segments = dict(segment_ids=(torch.arange(tokens) >= 40).long().unsqueeze(0), num_segments=2)
    ids = _routed(logits.detach(), k)
    before = expert_load([ids], valid, experts)[0]
    assert before[5] == tokens

    balance_loss([logits], [ids], valid, PROBS[p_source], **segments).backward()
    grad = logits.grad[0]
    # the overloaded expert's logit has a positive gradient at every token (descent lowers it); the others,
    # each below the mean load, have negative ones (descent raises them)
    assert (grad[:, 5] > 0).all()
    others = [e for e in range(experts) if e != 5 and before[e] < before.mean()]
    assert others and (grad[:, others] < 0).all()

    with torch.no_grad():
        stepped = logits - 2000.0 * logits.grad  # one descent step
    after = expert_load([_routed(stepped, k)], valid, experts)[0]
    assert after[5] < before[5] / 2
    assert after.max() / after.mean() < before.max() / before.mean()


def test_sequence_scope_sees_a_collapse_that_the_pack_average_hides() -> None:
    # two samples: sample A puts all its tokens on experts 0 and 1, sample B on 2 and 3; over the pack every
    # expert carries a quarter of the slots, so the batch loss is at its minimum for that f and has no pull
    experts, k, per_sample = 4, 2, 8
    logits = torch.zeros(1, 2 * per_sample, experts)
    logits[0, :per_sample, :2] = 1.0
    logits[0, per_sample:, 2:] = 1.0
    logits.requires_grad_(True)
    ids = _routed(logits.detach(), k)
    valid = torch.ones(1, 2 * per_sample, dtype=torch.bool)
    seg = (torch.arange(2 * per_sample) >= per_sample).long().unsqueeze(0)

    batch = balance_loss([logits], [ids], valid, PROBS["sigmoid"])
    (batch_grad,) = torch.autograd.grad(batch, logits)
    sequence = balance_loss([logits], [ids], valid, PROBS["sigmoid"], segment_ids=seg, num_segments=2)
    (seq_grad,) = torch.autograd.grad(sequence, logits)

    assert batch.item() == pytest.approx(1.0, abs=1e-6)  # E * sum_i (1/E) P_i = sum_i P_i = 1
    assert batch_grad.abs().max().item() < 1e-7
    # per sample: f = 1/2 on its two experts, P = s/(2s + 2*0.5) there -> E * 2 * 1/2 * P
    s = 1 / (1 + math.exp(-1.0))
    assert sequence.item() == pytest.approx(experts * s / (2 * s + 1), rel=1e-6)
    assert (seq_grad[0, :per_sample, :2] > 0).all() and (seq_grad[0, :per_sample, 2:] < 0).all()
    assert (seq_grad[0, per_sample:, 2:] > 0).all() and (seq_grad[0, per_sample:, :2] < 0).all()


def test_sequence_scope_is_the_mean_of_per_sample_losses_and_skips_padding() -> None:
    # two samples of 2 and 1 valid tokens, then tail padding (segment id 2 = no segment) and an invalid row
    logits, topk = LOGITS + [[0.0, 0.0, 5.0, 5.0]], TOPK + [[2, 3]]
    valid = [True, True, False, True, False]
    seg = torch.tensor([[0, 0, 0, 1, 2]])
    got = balance_loss([torch.tensor([logits])], [torch.tensor([topk])], torch.tensor([valid]), PROBS["sigmoid"],
                       segment_ids=seg, num_segments=2)
    first = naive_loss(LOGITS[:3], TOPK[:3], [True, True, False], "sigmoid")
    second = naive_loss([LOGITS[3]], [TOPK[3]], [True], "sigmoid")
    assert got.item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_objective_sequence_scope_reads_the_packs_segments() -> None:
    logits, topk, _ = tensors()
    out = HandOutput(text_logits=torch.zeros(0, 5), text_rows=torch.zeros(0, dtype=torch.long),
                     image_logits=torch.zeros(0, 2, 3), image_rows=torch.zeros(0, dtype=torch.long),
                     router_logits=[logits], router_topk_ids=[topk])
    batch = make_batch([1, 1, 1, 0], torch.full((1, 4, 2), -100), token_valid=VALID)
    batch.cu_seqlens = torch.tensor([0, 1, 3], dtype=torch.int32)  # samples [0, 1) and [1, 3); row 3 is tail
    cfg = ObjectiveConfig(balance=BalanceConfig(aux_coef=0.1, aux_scope="sequence", bias_update=False))
    objective = LuminaObjective(cfg)
    with pytest.raises(ValueError, match=r"p_source='router'.*configure_routers"):
        objective(out, batch)  # p_source "router" (the default): P comes from the model's routers
    assert objective.configure_routers(SIGMOID_ROUTER) == 1
    result = objective(out, batch)
    expected = 0.1 * (naive_loss(LOGITS[:1], TOPK[:1], [True], "sigmoid")
                      + naive_loss(LOGITS[1:3], TOPK[1:3], [True, True], "sigmoid")) / 2
    assert result.balance_loss.item() == pytest.approx(expected, rel=1e-6)
