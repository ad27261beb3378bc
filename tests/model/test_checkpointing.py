"""Activation checkpointing policies (`LuminaConfig.gradient_checkpointing`), applied by `apply_checkpointing`
or the training build (`LuminaModule.configure_model`): the loss and gradients of `none` bit for bit, the
routers' top-k replayed on recompute, legacy bool values, and the bytes each policy saves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from model_helpers import MIXED_TYPES, make_batch
from omegaconf import OmegaConf

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.activation_checkpointing import RoutingTape, apply_checkpointing
from lumina.model.config import CHECKPOINT_POLICIES
from lumina.model.routers import ROUTERS, MoERouter
from lumina.objective import LuminaObjective
from lumina.training.module import LuminaModule

CONF_MODELS = Path(__file__).resolve().parents[2] / "conf" / "model"
RECOMPUTING = ("full", "selective")


@dataclass
class Step:
    """One training step's loss, parameter gradients and expert load [L, E], and the model it ran."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    load: torch.Tensor
    model: LuminaModel


def tiny_model(policy: str | bool, router: str = "sigmoid") -> LuminaModel:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(gradient_checkpointing=policy, score_function=router))
    apply_checkpointing(model, model.config.gradient_checkpointing)
    return model


def train_step(policy: str, batch: PackedBatch, bias_after_forward: float = 0.0, router: str = "sigmoid") -> Step:
    """Forward + LuminaObjective + backward with the router named `router`; `bias_after_forward` != 0 sets
    every router's expert bias to that multiple of arange(E) between forward and backward (a recompute
    without replay would route anew). The load is counted from the forward's routing output."""
    model = tiny_model(policy, router)
    output = model(batch)
    load = torch.stack([torch.bincount(ids.reshape(-1), minlength=model.config.num_experts)
                        for ids in output.router_topk_ids])
    loss = LuminaObjective()(output, batch).loss
    if bias_after_forward:
        with torch.no_grad():
            for moe in model.moe_layers():
                moe.gate.expert_bias.copy_(bias_after_forward * torch.arange(moe.num_experts))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return Step(loss.detach(), grads, load, model)


def assert_equal_steps(got: Step, want: Step) -> None:
    assert torch.equal(got.loss, want.loss)
    assert got.grads.keys() == want.grads.keys()
    for name, grad in want.grads.items():
        assert grad is not None and got.grads[name] is not None, name
        assert torch.equal(got.grads[name], grad), name


@pytest.fixture(scope="module")
def batch() -> PackedBatch:
    return make_batch(MIXED_TYPES)


@pytest.fixture(scope="module")
def reference(batch: PackedBatch) -> Step:
    return train_step("none", batch)


@pytest.fixture(scope="module", params=ROUTERS.names())
def router(request: pytest.FixtureRequest) -> str:
    """Every registered router (`lumina.model.routers`): replay must recompute each one's own weights."""
    return request.param


def count_replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch `RoutingTape.take` to count the router calls a recompute serves from a tape -> [count]."""
    replays, take = [0], RoutingTape.take

    def counted(tape: RoutingTape, ids: torch.Tensor) -> torch.Tensor:
        replays[0] += tape.cursor is not None
        return take(tape, ids)

    monkeypatch.setattr(RoutingTape, "take", counted)
    return replays


@pytest.mark.parametrize("policy", RECOMPUTING)
def test_policy_gives_the_loss_gradients_and_load_of_none_exactly(policy: str, router: str, batch: PackedBatch,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reference = train_step("none", batch, router=router)
    replays = count_replays(monkeypatch)
    step = train_step(policy, batch, router=router)
    assert type(step.model.moe_layers()[0].gate) is ROUTERS.get(router, "score_function")
    assert_equal_steps(step, reference)
    num_moe = step.model.config.num_moe_layers
    assert replays[0] == num_moe  # each MoE layer's router ran again in backward
    assert torch.equal(step.load, reference.load)
    assert int(step.load.sum()) == len(MIXED_TYPES) * step.model.config.num_experts_per_tok * num_moe  # once


@pytest.mark.parametrize("policy", RECOMPUTING)
def test_recompute_replays_the_forward_routing(policy: str, batch: PackedBatch, reference: Step) -> None:
    """An expert bias changed between forward and backward would make the recompute pick other experts."""
    model = tiny_model("none")
    before = model(batch).router_topk_ids
    with torch.no_grad():
        for moe in model.moe_layers():
            moe.gate.expert_bias.copy_(10.0 * torch.arange(moe.num_experts))
        after = model(batch).router_topk_ids
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert_equal_steps(train_step(policy, batch, bias_after_forward=10.0), reference)


@pytest.mark.parametrize(("value", "policy"), [(True, "full"), (False, "none"), ("selective", "selective")])
def test_legacy_bools_map_to_policies(value: bool | str, policy: str) -> None:
    assert LuminaConfig.tiny(gradient_checkpointing=value).gradient_checkpointing == policy
    assert LuminaConfig.tiny().replace(gradient_checkpointing=value).gradient_checkpointing == policy
    assert apply_checkpointing(tiny_model("none"), value) == policy


@pytest.mark.parametrize("value", ["partial", "Full", 1, None])
def test_bad_policy_raises_naming_the_field_and_value(value: object) -> None:
    with pytest.raises(ValueError, match=rf"LuminaConfig\.gradient_checkpointing={value!r}"):
        LuminaConfig.tiny(gradient_checkpointing=value)
    model = tiny_model("none")
    with pytest.raises(ValueError, match=rf"^gradient_checkpointing={value!r}"):
        apply_checkpointing(model, value)


def saved_bytes_per_token(model: LuminaModel, batch: PackedBatch) -> float:
    """Bytes of the distinct non-parameter storages autograd saves in the backbone's forward, per token."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.backbone(batch)
    return sum(saved.values()) / batch.type_ids.numel()


def test_selective_saves_fewer_bytes_than_none_and_full_fewer_than_selective() -> None:
    batch = make_batch(MIXED_TYPES * 4)
    none, full, selective = (saved_bytes_per_token(tiny_model(p), batch) for p in ("none", "full", "selective"))
    assert full < selective < 0.75 * none


def test_conf_models_name_a_policy() -> None:
    values = {path.name: OmegaConf.load(path).config.get("gradient_checkpointing")
              for path in sorted(CONF_MODELS.glob("*.yaml"))}
    named = {name: value for name, value in values.items() if value is not None}
    assert {"tiny.yaml", "official.yaml", "hf.yaml"} <= named.keys()
    assert all(isinstance(v, str) and v in CHECKPOINT_POLICIES for v in named.values()), named


@pytest.mark.parametrize("policy", RECOMPUTING)
def test_channel_head_recomputed_in_row_chunks_matches_none(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunks of 3 image rows (the pack has 4 supervised image rows: two chunks), the channel head's
    parameter gradients are sums over chunks, and the backbone's gradients follow from the chunked head's
    input gradients: all equal to `none` to fp32 rounding (bitwise on some CPUs' kernels, not on all)."""
    import lumina.model.activation_checkpointing as checkpointing

    monkeypatch.setattr(checkpointing, "CHANNEL_CHECKPOINT_ROWS", 3)
    batch = make_batch(MIXED_TYPES)
    got, want = train_step(policy, batch), train_step("none", batch)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=0)
    for name, grad in want.grads.items():
        torch.testing.assert_close(got.grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()) + 1e-9,
                                   msg=name)


def backward_replays(model: LuminaModel, batch: PackedBatch, monkeypatch: pytest.MonkeyPatch) -> int:
    """Router calls served from a routing tape in one forward + objective + backward of `model`."""
    replays = count_replays(monkeypatch)
    LuminaObjective()(model(batch), batch).loss.backward()
    return replays[0]


@pytest.mark.parametrize("policy", RECOMPUTING)
def test_the_training_build_applies_the_configs_policy(policy: str, batch: PackedBatch,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    module = LuminaModule(LuminaConfig.tiny(gradient_checkpointing=policy))
    module.configure_model()
    assert backward_replays(module.model, batch, monkeypatch) == module.model.config.num_moe_layers


def test_the_constructor_alone_checkpoints_nothing(batch: PackedBatch, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(gradient_checkpointing="full"))
    assert backward_replays(model, batch, monkeypatch) == 0
    wide = make_batch(MIXED_TYPES * 4)
    assert saved_bytes_per_token(model, wide) == saved_bytes_per_token(tiny_model("none"), wide)


def test_applying_again_replaces_the_policy_and_keeps_the_official_keys(batch: PackedBatch,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("none")
    keys = list(model.state_dict())
    assert apply_checkpointing(model, "full") == "full"
    assert list(model.state_dict()) == keys  # no wrapper modules, no renamed keys
    assert apply_checkpointing(model, "none") == "none"
    assert backward_replays(model, batch, monkeypatch) == 0
    assert not any(router._forward_hooks for router in model.modules() if isinstance(router, MoERouter))
