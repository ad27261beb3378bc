"""Grouped expert compute, the dispatcher seam, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lumina.model import GroupedExperts, LocalDispatcher, LuminaConfig, MoE
from lumina.model.experts import (
    combine_copies,
    experts_per_rank,
    grouped_mm_supported,
    grouped_swiglu,
    inverse_permutation,
)
from lumina.model.moe_dispatch import group_by_expert

E, H, INTER, K = 8, 32, 16, 2


def _boolean_mask_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                            experts: GroupedExperts) -> torch.Tensor:
    """The official non-fused training path: loop over ALL experts, pick tokens with a boolean mask."""
    out = torch.zeros_like(x)
    for e in range(experts.num_local_experts):
        mask = ids == e  # [T, k]
        token, slot = mask.nonzero(as_tuple=True)
        rows = x[token]
        y = F.linear(F.silu(F.linear(rows, experts.gate_proj[e])) * F.linear(rows, experts.up_proj[e]),
                     experts.down_proj[e])
        out = out.index_add(0, token, y * weights[token, slot, None].to(x.dtype))
    return out


def _routed(backend: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    experts = GroupedExperts(E, H, INTER, backend=backend)
    x = torch.randn(40, H, requires_grad=True)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(40)])
    ids[:10] = torch.tensor([0, 3])  # uneven load; expert 7 may get none
    weights = torch.rand(40, K)
    return experts, x, ids, weights


def _sorted_rows_path(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                     experts: GroupedExperts) -> torch.Tensor:
    """The expert-parallel path without its all-to-all: gather -> experts on sorted rows -> combine_copies."""
    order, counts = group_by_expert(ids, E)
    rows = experts(x.index_select(0, order // K), counts)
    return combine_copies(rows, weights, order, inverse_permutation(order))


def _routed_path(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                 experts: GroupedExperts) -> torch.Tensor:
    """The local path: the experts gather, compute and weigh in one step."""
    return LocalDispatcher().run_experts(x, ids, weights, experts)


@pytest.mark.parametrize("path", [_routed_path, _sorted_rows_path])
@pytest.mark.parametrize("backend", ["grouped_mm", "loop"])
def test_grouped_experts_equal_the_boolean_mask_reference_outputs_and_grads(backend: str, path) -> None:  # noqa: ANN001
    experts, x, ids, weights = _routed(backend)
    weights.requires_grad_()
    got = path(x, ids, weights, experts)
    g = torch.randn_like(got)
    params = [x, weights, experts.gate_proj, experts.up_proj, experts.down_proj]
    grads = torch.autograd.grad(got, params, g)

    want = _boolean_mask_reference(x, ids, weights, experts)
    want_grads = torch.autograd.grad(want, params, g)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_grouped_mm_and_loop_backends_agree() -> None:
    results = []
    for backend in ("grouped_mm", "loop"):
        experts, x, ids, weights = _routed(backend, seed=3)
        order, counts = group_by_expert(ids, E)
        y = experts(x.index_select(0, order // K), counts)
        y.sum().backward()  # an expanded gradient: must reach _grouped_mm contiguous
        results.append((y, x.grad, experts.gate_proj.grad, experts.down_proj.grad))
    assert grouped_mm_supported(torch.zeros(1, H), torch.zeros(E, INTER, H))  # the grouped kernel really ran
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _expert_weights(dtype: torch.dtype = torch.float32, scale: float = 1.0) -> list[torch.Tensor]:
    """Random gate [E, I, H], up [E, I, H] and down [E, H, I] projections."""
    return [torch.randn(E, *shape, dtype=dtype) * scale for shape in ((INTER, H), (INTER, H), (H, INTER))]


def _plain_grouped_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                          counts: torch.Tensor) -> torch.Tensor:
    """The same three grouped GEMMs composed with autograd's own backward (what the fused Function replaces)."""
    offsets = counts.cumsum(0).to(torch.int32)
    hidden = F.silu(torch._grouped_mm(x, gate.mT, offs=offsets)) * torch._grouped_mm(x, up.mT, offs=offsets)
    return torch._grouped_mm(hidden, down.mT, offs=offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_swiglu_equals_the_autograd_composition_to_the_bit(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    counts = torch.tensor([0, 21, 3, 0, 1, 30, 2, 0])  # empty experts
    x = torch.randn(int(counts.sum()), H, dtype=dtype)
    weights = _expert_weights(dtype, scale=0.2)
    grad = torch.randn(x.shape[0], H, dtype=dtype)
    results = []
    for fn in (grouped_swiglu, _plain_grouped_swiglu):
        inputs = [t.clone().requires_grad_() for t in (x, *weights)]
        y = fn(*inputs, counts)
        results.append((y, *torch.autograd.grad(y, inputs, grad)))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
    assert results[0][3].abs().sum(dim=(1, 2)).eq(0).tolist() == counts.eq(0).tolist()  # empty: zero grads


def test_grouped_swiglu_saves_x_and_the_two_projections_only() -> None:
    """Saved activations: x, gate x and up x (the hidden product is recomputed in the backward); the composition
    also keeps silu(gate x) and the hidden product."""
    torch.manual_seed(0)
    counts = torch.tensor([5, 0, 7, 4, 0, 9, 1, 6])
    n = int(counts.sum())
    inputs = [torch.randn(n, H), *(w.requires_grad_() for w in _expert_weights())]
    weight_storages = {w.untyped_storage().data_ptr() for w in inputs[1:]}
    saved = {}
    for fn in (grouped_swiglu, _plain_grouped_swiglu):
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor, storages: dict[int, int] = storages) -> torch.Tensor:
            if t.is_floating_point() and t.untyped_storage().data_ptr() not in weight_storages:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*inputs, counts)
        saved[fn.__name__] = sum(storages.values())
    assert saved["grouped_swiglu"] == (n * H + 2 * n * INTER) * 4
    assert saved["_plain_grouped_swiglu"] == (n * H + 4 * n * INTER) * 4


def test_grouped_swiglu_refuses_a_second_backward_on_one_graph() -> None:
    counts = torch.tensor([3, 0, 2, 1, 0, 0, 0, 4])
    inputs = [torch.randn(10, H, requires_grad=True), *(w.requires_grad_() for w in _expert_weights())]
    y = grouped_swiglu(*inputs, counts)
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.sum().backward()


def test_grouped_experts_handle_zero_tokens() -> None:
    experts = GroupedExperts(E, H, INTER)
    x = torch.zeros(0, H, requires_grad=True)
    y = experts(x, torch.zeros(E, dtype=torch.long))
    y.sum().backward()
    assert y.shape == (0, H) and torch.count_nonzero(experts.gate_proj.grad) == 0


def test_tokens_per_expert_must_cover_the_local_experts() -> None:
    with pytest.raises(ValueError, match="tokens_per_expert"):
        GroupedExperts(E, H, INTER)(torch.zeros(3, H), torch.tensor([3]))


class RecordingDispatcher:
    """Another dispatcher: gather -> experts on sorted rows -> combine (the expert-parallel path's steps on one
    device), counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def run_experts(self, x, topk_ids, topk_weights, experts):  # noqa: ANN001, ANN201
        self.calls += 1
        order, counts = group_by_expert(topk_ids, experts.num_local_experts)
        rows = experts(x.index_select(0, order // topk_ids.shape[1]), counts)
        return combine_copies(rows, topk_weights, order, inverse_permutation(order))


def test_the_dispatcher_is_a_replaceable_object() -> None:
    """The MoE calls whatever dispatcher it holds; the sorted-rows steps equal the local fused step."""
    cfg = LuminaConfig.tiny()
    torch.manual_seed(0)
    moe = MoE(cfg)
    x = torch.randn(1, 6, cfg.hidden_size)
    before, _ = moe(x)
    moe.dispatcher = RecordingDispatcher()
    after, _ = moe(x)
    assert moe.dispatcher.calls == 1
    torch.testing.assert_close(before, after)


def test_bf16_combine_weighs_and_sums_in_fp32() -> None:
    """bf16 copies: output = bf16(sum_k w * y.float()), grads follow the fp32 computation."""
    _, _, ids, weights = _routed("grouped_mm")
    x = torch.randn(40, H, dtype=torch.bfloat16, requires_grad=True)
    w = weights.clone().requires_grad_()
    order, _ = group_by_expert(ids, E)
    out = combine_copies(x.index_select(0, order // K) * 3, w, order, inverse_permutation(order))
    g = torch.randn(40, H, dtype=torch.bfloat16)
    out.backward(g)
    copies = (x.detach() * 3).float().unsqueeze(1)  # every copy of token t is bf16(3 * x[t])
    want = (weights.unsqueeze(-1) * copies).sum(1)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.to(torch.bfloat16))  # k = 2: the fp32 sum is exact to the bit, rounded once
    torch.testing.assert_close(x.grad.float(), 3 * weights.sum(1, keepdim=True) * g.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(w.grad, (g.float().unsqueeze(1) * copies).sum(-1).expand(-1, K), rtol=1e-5, atol=1e-5)


def test_ep_must_divide_the_experts() -> None:
    assert experts_per_rank(8, 2) == 4
    with pytest.raises(ValueError, match=r"num_experts=8 is not divisible by the expert-parallel size ep=3"):
        experts_per_rank(8, 3)
