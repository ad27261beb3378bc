"""`apply_compile` (model.compile): the compiled tiny model gives eager's loss and every gradient, in fp32 and
under bf16 autocast, with each checkpointing policy (routing replayed on recompute), and keeps its state-dict
keys, and graphs really are compiled for the layers' forward and ffn and the channel head's blocks (dynamo's
cache entries of their code). Inductor compiles on CPU here (gcc); the graphs land in the inductor cache, so a
rerun compiles little."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from model_helpers import MIXED_TYPES, make_batch
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.activation_checkpointing import RoutingTape, apply_checkpointing
from lumina.model.compile import apply_compile, compiled_graphs
from lumina.objective import LuminaObjective

# fp32: per gradient tensor, max |compiled - eager| <= RTOL * max |eager| + ATOL (fused kernels reorder
# reductions; ATOL covers gradients that are zero up to rounding, e.g. the channel head's k_norm bias).
RTOL, ATOL, LOSS_RTOL = 2e-4, 1e-8, 1e-5
# bf16 autocast: inductor keeps a fused kernel's intermediates in fp32 where eager rounds each op to bf16, so
# the two differ by bf16 rounding (a few % of a tensor's max). Both are held against the fp32 gradients: the
# compiled error is at most BF16_FACTOR x the eager one (+ BF16_FLOOR of the tensor's max).
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3


def tiny_model() -> LuminaModel:
    torch.manual_seed(0)
    return LuminaModel(LuminaConfig.tiny())


@dataclass
class Step:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    topk_ids: list[torch.Tensor]


def train_step(model: LuminaModel, batch: PackedBatch, dtype: str, bias_after_forward: float = 0.0) -> Step:
    """Forward + LuminaObjective + backward from zero gradients and expert biases; `bias_after_forward` != 0
    sets every router's expert bias to that multiple of arange(E) between forward and backward (a recompute
    without replay would route anew)."""
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for moe in model.moe_layers():
            moe.gate.expert_bias.zero_()
    with torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bf16"):
        output = model(batch)
        loss = LuminaObjective()(output, batch).loss
    if bias_after_forward:
        with torch.no_grad():
            for moe in model.moe_layers():
                moe.gate.expert_bias.copy_(bias_after_forward * torch.arange(moe.num_experts))
    loss.backward()
    return Step(loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, output.router_topk_ids)


@pytest.fixture(scope="module")
def batch() -> PackedBatch:
    return make_batch(MIXED_TYPES)


@pytest.fixture(scope="module")
def eager(batch: PackedBatch) -> dict[str, Step]:
    model = tiny_model()
    return {dtype: train_step(model, batch, dtype) for dtype in ("fp32", "bf16")}


@pytest.fixture(scope="module")
def compiled() -> LuminaModel:
    """One compiled model for every case (each policy then applied to it as `configure_model` does,
    checkpointing first: the graphs are shared, fewer compiles)."""
    model = tiny_model()
    keys = list(model.state_dict())
    torch._dynamo.reset()  # no graphs of an earlier test in this process: this module's compile their own
    apply_compile(model)
    assert list(model.state_dict()) == keys  # the official layout, no `_orig_mod.`
    return model


def test_apply_compile_compiles_the_layers_and_the_head(batch: PackedBatch, compiled: LuminaModel) -> None:
    """Parity alone passes when `apply_compile` compiles nothing: dynamo must hold compiled graphs for every
    function it compiles once the model ran a step."""
    apply_checkpointing(compiled, "none")
    apply_compile(compiled)
    train_step(compiled, batch, "fp32")
    layer, head = compiled.model.layers[-1], compiled.multi_codebook_head
    for name, code in [("decoder layer forward", type(layer).forward.__code__),
                       ("decoder layer ffn", type(layer).ffn.__code__),
                       ("channel head run", type(head).run.__code__)]:
        assert _debug_get_cache_entry_list(code), f"{name}: no compiled graph"
    assert compiled_graphs() > 0  # what training logs as compile/graphs


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


@pytest.mark.parametrize("policy", ["none", "full", "selective"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_compiled_gives_eager_loss_and_every_gradient(policy: str, dtype: str, batch: PackedBatch,
                                                       eager: dict[str, Step], compiled: LuminaModel,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    apply_checkpointing(compiled, policy)
    apply_compile(compiled)
    replays, take = [0], RoutingTape.take

    def counted(tape: RoutingTape, ids: torch.Tensor) -> torch.Tensor:
        replays[0] += tape.cursor is not None
        return take(tape, ids)

    monkeypatch.setattr(RoutingTape, "take", counted)
    bias = 0.0 if policy == "none" else 10.0  # under checkpointing: only an exact replay keeps the gradients
    got = train_step(compiled, batch, dtype, bias_after_forward=bias)
    assert replays[0] == (0 if policy == "none" else compiled.config.num_moe_layers)
    want, reference = eager[dtype], eager["fp32"]
    for ids, want_ids in zip(got.topk_ids, want.topk_ids, strict=True):
        assert torch.equal(ids, want_ids)
    assert got.grads.keys() == want.grads.keys()
    if dtype == "fp32":
        torch.testing.assert_close(got.loss, want.loss, rtol=LOSS_RTOL, atol=0)
        for name, grad in want.grads.items():
            error = (got.grads[name] - grad).abs().max().item()
            assert error <= RTOL * grad.abs().max().item() + ATOL, f"{name}: max error {error:.3g}"
        return
    assert relative_error(got.loss, reference.loss) <= BF16_FACTOR * relative_error(want.loss, reference.loss) \
        + BF16_FLOOR
    for name, grad in reference.grads.items():
        error, eager_error = relative_error(got.grads[name], grad), relative_error(want.grads[name], grad)
        assert error <= BF16_FACTOR * eager_error + BF16_FLOOR, f"{name}: {error:.3g} vs eager {eager_error:.3g}"
