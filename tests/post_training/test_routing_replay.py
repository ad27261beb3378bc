"""Routing replay between the rollout's policy and the update (`objective.post_training.routing`, R3), on the
tiny MoE with training-mode selection noise, so that two passes over the same views route differently."""

from __future__ import annotations

import pytest
import torch
from toy_rewards import low_codes, short_answer

from lumina.contract.schema import Text
from lumina.generation.sequences import Prompt
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.activation_checkpointing import apply_checkpointing
from lumina.model.routers import MoERouter
from lumina.post_training.mode import PostTraining, PostTrainingConfig
from lumina.post_training.prompts import PromptBatch
from lumina.post_training.rewards import Rewards
from lumina.post_training.rollout import RolloutConfig
from lumina.post_training.samples import RLPrompt

CONFIG = RolloutConfig(group_size=3, temperature=1.0, image_steps=3, text_length=4, block_length=2, text_steps=2)


def _batch(tokens) -> PromptBatch:  # noqa: ANN001
    prompts = [RLPrompt(Prompt([Text([20, 21])], key="img", grid=(2, 2)), "t2i"),
               RLPrompt(Prompt([Text([22, 23, 24])], key="txt"), "text_qa")]
    return PromptBatch(0, prompts, tokens, ("t2i", "text_qa"))


def _noisy(model: torch.nn.Module) -> torch.nn.Module:
    for router in model.modules():
        if isinstance(router, MoERouter):
            router.selection_noise = 1.0
    return model.train()


def _step(model, tokens, routing: str):  # noqa: ANN001, ANN202
    """(mode, metrics, the update forwards' top-k ids per router call) of one GRPO step."""
    torch.manual_seed(0)
    mode = PostTraining(PostTrainingConfig(term="grpo", estimators={"text": "coupled", "image": "trajectory"},
                                           routing=routing),
                        CONFIG, Rewards({"t2i": low_codes, "text_qa": short_answer}))
    routed: list[torch.Tensor] = []
    loss, metrics = mode.step(model, None, _batch(tokens), step=0,
                              on_output=lambda out, batch: routed.extend(ids.reshape(-1, ids.shape[-1]) for ids in out.router_topk_ids))
    loss.backward()
    return mode, metrics, routed


def _missing_slots(fresh: list[torch.Tensor], recorded: list[torch.Tensor]) -> tuple[int, int]:
    """(top-k slots whose expert the recorded top-k of the same token lacks, all slots), by Python sets."""
    missing = total = 0
    for f, r in zip(fresh, recorded, strict=True):
        for f_row, r_row in zip(f.tolist(), r.tolist(), strict=True):
            missing += len([e for e in f_row if e not in set(r_row)])
            total += len(f_row)
    return missing, total


def test_compare_logs_the_share_of_slots_routed_elsewhere_than_the_rollout_policy(tiny_model, tokens):
    mode, metrics, fresh = _step(_noisy(tiny_model), tokens, "compare")
    recorded = mode._cycles[0].tapes[0].ids
    missing, total = _missing_slots(fresh, recorded)
    assert missing > 0  # the noise did move some tokens
    assert metrics["routing_divergence"].item() == pytest.approx(missing / total, rel=1e-6)


@pytest.mark.parametrize("policy", ["none", "full"])
def test_replay_routes_the_update_as_the_rollout_policy_did(tiny_model, tokens, policy):
    """R3: the update's routers use the recorded ids (under activation checkpointing too, whose recompute must
    replay the replayed ids), and the divergence still reports what the fresh routing would have been."""
    model = _noisy(tiny_model)
    apply_checkpointing(model, policy)
    mode, metrics, routed = _step(model, tokens, "replay")
    recorded = mode._cycles[0].tapes[0].ids
    assert len(routed) == len(recorded) and all(torch.equal(a, b) for a, b in zip(routed, recorded, strict=True))
    assert metrics["routing_divergence"].item() > 0
    assert all(p.grad is not None for n, p in model.named_parameters() if "router" in n and p.requires_grad)


def test_replay_gradients_are_the_same_with_activation_checkpointing(tokens):
    grads = []
    for policy in ("none", "full"):
        torch.manual_seed(0)
        model = _noisy(LuminaModel(LuminaConfig.tiny()))
        apply_checkpointing(model, policy)
        _step(model, tokens, "replay")
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_a_bad_routing_mode_is_refused_by_name():
    with pytest.raises(ValueError, match=r"objective.post_training.routing='r3'"):
        PostTrainingConfig(routing="r3")
