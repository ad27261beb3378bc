"""What one MoE layer's autograd keeps for the backward (counted with saved_tensors_hooks), and the fused local
path (`LocalDispatcher.run_experts` -> `routed_swiglu`) and the router against plain autograd compositions."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lumina_reference import moe as reference_moe
from torch.utils.checkpoint import checkpoint

from lumina.model import LocalDispatcher, LuminaConfig, MoE, SigmoidRouter
from lumina.model.experts import RoutedCopies, combine_copies, inverse_permutation, routed_swiglu
from lumina.model.moe_dispatch import group_by_expert

# the small config of the memory figures: hidden 256, 64 experts top-8, groups 8/4, moe_intermediate 128
SMALL = dict(hidden_size=256, num_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
             moe_intermediate_size=128, num_shared_experts=1)
# a reference-sized one: 16 experts top-4 (a token or five leave experts empty)
REF = dict(num_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4, num_shared_experts=1)


class _Held:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _saved_by_graph(fn: Callable[[], Any], exclude: set[int]) -> tuple[Any, dict[int, tuple[tuple[int, ...], int]]]:
    """Run fn() under saved_tensors_hooks -> (its result, {storage: (shape, bytes)} of the saved tensors the
    surviving graph still holds when fn returns), storages in `exclude` (parameters) left out."""
    packed: list[tuple[weakref.ref, torch.Tensor]] = []

    def pack(tensor: torch.Tensor) -> _Held:
        held = _Held(tensor)
        packed.append((weakref.ref(held), tensor))
        return held

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
        result = fn()
    saved = {}
    for ref, tensor in packed:
        storage = tensor.untyped_storage()
        if ref() is not None and storage.data_ptr() not in exclude:
            saved[storage.data_ptr()] = (tuple(tensor.shape), storage.nbytes())
    packed.clear()
    return result, saved


def saved_bytes_per_token_after(cfg: LuminaConfig) -> int:
    """fp32, per token of one MoE layer: x (4H, the layer input) + each copy's gate x and up x (2 * 4kI) + the
    copies' order (8k) and weights (4k) + the router's ids (8k), selected scores (4k) and normaliser (4) + the
    shared expert's four Is-wide activations (16 Is)."""
    h, i, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    return 4 * h + 8 * k * i + 12 * k + 12 * k + 4 + 16 * cfg.shared_expert_size


def saved_bytes_per_token_before(cfg: LuminaConfig) -> int:
    """The same before the fused path: also the gathered copies and the expert outputs (2 * 4kH), the hidden
    product (4kI), the inverse permutation (8k) and the router's [T, E] scores (4E)."""
    h, i, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    return saved_bytes_per_token_after(cfg) + 8 * k * h + 4 * k * i + 8 * k + 4 * cfg.num_experts


@pytest.mark.parametrize("tokens", [96, 512])
def test_moe_layer_saves_the_formula_bytes_per_token(tokens: int) -> None:
    """The fused local path (backend grouped_mm); per layer it also keeps the int32 expert offsets [E]."""
    cfg = LuminaConfig.tiny(**SMALL)
    torch.manual_seed(0)
    moe = MoE(cfg)
    x = torch.randn(1, tokens, cfg.hidden_size, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in moe.parameters()}
    (y, _), saved = _saved_by_graph(lambda: moe(x), params)
    total = sum(nbytes for _, nbytes in saved.values())
    assert total == tokens * saved_bytes_per_token_after(cfg) + 4 * cfg.num_experts
    assert total < tokens * saved_bytes_per_token_before(cfg)
    copies = tokens * cfg.num_experts_per_tok
    assert max(nbytes for _, nbytes in saved.values()) < copies * cfg.hidden_size * 4  # no [T*k, H] tensor
    assert (copies, cfg.moe_intermediate_size) in {shape for shape, _ in saved.values()}  # gate x, up x kept
    y.sum().backward()  # the graph counted is the one that runs
    assert x.grad is not None and bool(x.grad.ne(0).any())


def _reference_grads(moe: MoE, x: torch.Tensor, grad: torch.Tensor,
                     cfg: LuminaConfig) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The per-token loop of lumina_reference (plain autograd) on the module's own parameters ->
    (y [T, H], ids [T, k], gradients of x and of every parameter)."""
    sd = {**dict(moe.named_buffers()), **dict(moe.named_parameters())}
    y, ids = reference_moe(x, sd, "", cfg)
    return y, ids, list(torch.autograd.grad(y, [x, *moe.parameters()], grad))


@pytest.mark.parametrize("backend", ["grouped_mm", "loop"])
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_fused_moe_equals_the_per_token_reference(backend: str, tokens: int) -> None:
    cfg = LuminaConfig.tiny(**REF, moe_backend=backend)
    torch.manual_seed(tokens)
    moe = MoE(cfg)
    with torch.no_grad():
        moe.gate.expert_bias.copy_(0.3 * torch.randn(cfg.num_experts))
    x = torch.randn(tokens, cfg.hidden_size, requires_grad=True)
    grad = torch.randn(tokens, cfg.hidden_size)
    y, routing = moe(x.unsqueeze(0))
    got = torch.autograd.grad(y.squeeze(0), [x, *moe.parameters()], grad)
    want_y, ids, want = _reference_grads(moe, x, grad, cfg)
    assert torch.equal(routing.topk_ids, ids)
    if tokens < 40:
        assert bool(torch.bincount(ids.flatten(), minlength=cfg.num_experts).eq(0).any())  # empty experts
    torch.testing.assert_close(y.squeeze(0), want_y, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(["x", *(n for n, _ in moe.named_parameters())], got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def _composed_routed(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                     ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Plain autograd: each (token, slot) copy through its expert, weighted in fp32, summed over the k slots."""
    g, u, d = gate[ids], up[ids], down[ids]  # [T, k, I, H], [T, k, I, H], [T, k, H, I]
    rows = x.unsqueeze(1).unsqueeze(-1)  # [T, 1, H, 1]
    hidden = F.silu((g @ rows).squeeze(-1)) * (u @ rows).squeeze(-1)  # [T, k, I]
    y = (d @ hidden.unsqueeze(-1)).squeeze(-1)  # [T, k, H]
    return (y.float() * weights.unsqueeze(-1)).sum(1).to(x.dtype)


# which inputs want a gradient: all; the expert weights only (frozen activations and router)
@pytest.mark.parametrize("wanted", [(True, True, True), (False, False, True)])
def test_routed_swiglu_equals_the_copy_by_copy_composition(wanted: tuple[bool, ...]) -> None:
    torch.manual_seed(1)
    num_experts, hidden, inter, top_k, tokens = 8, 32, 16, 3, 11
    used = torch.tensor([0, 1, 2, 3, 4, 5, 7])  # expert 6 gets no copy
    ids = torch.stack([used[torch.randperm(used.numel())[:top_k]] for _ in range(tokens)])
    x = torch.randn(tokens, hidden, requires_grad=wanted[0])
    weights = torch.rand(tokens, top_k, requires_grad=wanted[1])
    experts = [(torch.randn(num_experts, *shape) * 0.3).requires_grad_(wanted[2])
               for shape in ((inter, hidden), (inter, hidden), (hidden, inter))]
    order = ids.flatten().argsort(stable=True)
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    grad = torch.randn(tokens, hidden)
    inputs = [t for t, want in zip([x, weights, *experts], [*wanted[:2], wanted[2], wanted[2], wanted[2]],
                                   strict=True) if want]
    got = routed_swiglu(x, *experts, counts, RoutedCopies(order, weights))
    want = _composed_routed(x, *experts, ids, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if wanted[2]:
        grad_gate = torch.autograd.grad(routed_swiglu(x, *experts, counts, RoutedCopies(order, weights)),
                                        experts[0], grad)[0]
        assert bool(grad_gate[6].eq(0).all()) and bool(grad_gate[1].ne(0).any())  # the empty expert: zero


def test_fused_moe_recomputes_under_checkpointing_and_refuses_a_second_backward() -> None:
    cfg = LuminaConfig.tiny(**REF)
    torch.manual_seed(0)
    moe = MoE(cfg)
    x = torch.randn(1, 9, cfg.hidden_size, requires_grad=True)
    params = [x, *moe.parameters()]
    plain = torch.autograd.grad(moe(x)[0].square().sum(), params)
    y = checkpoint(lambda t: moe(t)[0], x, use_reentrant=False)
    recomputed = torch.autograd.grad(y.square().sum(), params, retain_graph=True)
    for a, b in zip(recomputed, plain, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="retain_graph"):
        torch.autograd.grad(y.square().sum(), params)


def test_bf16_fused_moe_is_as_close_to_fp64_as_the_unfused_path() -> None:
    """bf16: the fused step rounds in other places than gather -> experts -> combine; neither is further
    than twice the other's error from the fp64 computation (the same module in float64)."""
    cfg = LuminaConfig.tiny(**REF)
    torch.manual_seed(0)
    moe = MoE(cfg).bfloat16()
    exact = MoE(cfg).double()
    exact.load_state_dict(moe.state_dict())
    x = torch.randn(1, 40, cfg.hidden_size, dtype=torch.bfloat16)
    grad = torch.randn(1, 40, cfg.hidden_size, dtype=torch.bfloat16)

    def run(module: MoE, dispatcher: object, dtype: torch.dtype) -> list[torch.Tensor]:
        module.dispatcher = dispatcher
        leaf = x.to(dtype).requires_grad_()
        y, _ = module(leaf)
        return [y.detach(), *torch.autograd.grad(y, [leaf, *module.parameters()], grad.to(dtype))]

    class Unfused:  # the expert-parallel path's steps on one device: gather -> experts on sorted rows -> combine
        def run_experts(self, x, topk_ids, topk_weights, experts):  # noqa: ANN001, ANN201
            order, counts = group_by_expert(topk_ids, experts.num_local_experts)
            rows = experts(x.index_select(0, order // topk_ids.shape[1]), counts)
            return combine_copies(rows, topk_weights, order, inverse_permutation(order))

    fused = run(moe, LocalDispatcher(), torch.bfloat16)
    unfused = run(moe, Unfused(), torch.bfloat16)
    truth = run(exact, Unfused(), torch.float64)
    for a, b, t in zip(fused, unfused, truth, strict=True):
        fused_error, unfused_error = (float((v.double() - t).abs().max()) for v in (a, b))
        assert fused_error <= 2 * unfused_error + 1e-3 * float(t.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k", [1, 4])
def test_router_equals_the_plain_composition_to_the_bit_and_keeps_no_wide_tensor(dtype: torch.dtype,
                                                                                top_k: int) -> None:
    cfg = LuminaConfig.tiny(**{**REF, "num_experts_per_tok": top_k}, routed_scaling_factor=2.5)
    torch.manual_seed(0)
    router = SigmoidRouter(cfg).to(dtype)
    with torch.no_grad():
        router.expert_bias.copy_(0.3 * torch.randn(cfg.num_experts))
    x = torch.randn(37, cfg.hidden_size, dtype=dtype, requires_grad=True)
    got, saved = _saved_by_graph(lambda: router(x), {router.weight.untyped_storage().data_ptr()})
    grad_w, grad_logits = torch.randn(37, top_k), torch.randn(37, cfg.num_experts)
    loss = (got.topk_weights * grad_w).sum() + (got.logits * grad_logits).sum()
    got_grads = torch.autograd.grad(loss, [x, router.weight])
    logits = F.linear(x.float(), router.weight.float())
    weights = router.weigh(logits, got.topk_ids)
    want_grads = torch.autograd.grad((weights * grad_w).sum() + (logits * grad_logits).sum(), [x, router.weight])
    assert torch.equal(got.logits, logits) and torch.equal(got.topk_weights, weights)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert torch.equal(a, b)
    # kept: x in its own dtype, the ids, the selected scores (and their sum); no [T, E] scores, no fp32 copy of x
    assert sorted(shape for shape, _ in saved.values()) == sorted([(37, cfg.hidden_size), (37, top_k), (37, top_k)]
                                                                  + ([(37, 1)] if top_k > 1 else []))
    assert x.untyped_storage().data_ptr() in saved


def test_the_combine_in_token_chunks_equals_it_whole_to_the_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sum_copies` gathers the copies COMBINE_CHUNK_BYTES at a time (forward and backward of the fused
    path): one token per chunk gives the same outputs and gradients as one chunk."""
    from lumina.model import experts

    cfg = LuminaConfig.tiny(**REF)
    torch.manual_seed(0)
    moe = MoE(cfg)
    x = torch.randn(1, 9, cfg.hidden_size, requires_grad=True)
    results = []
    for chunk_bytes in (2**30, 1):
        monkeypatch.setattr(experts, "COMBINE_CHUNK_BYTES", chunk_bytes)
        y = moe(x)[0]
        results.append([y, *torch.autograd.grad(y.square().sum(), [x, *moe.parameters()])])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
