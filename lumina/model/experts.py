"""Routed experts with fused parameters (`mlp.experts.{gate,up,down}_proj`, no `.weight` suffix):
`gate_proj`/`up_proj` [E, I, H], `down_proj` [E, H, I].

Each expert's SwiGLU over expert-sorted rows: `reference_swiglu` (a matmul per expert; backend "loop", and
wherever `torch._grouped_mm` cannot run) or fused (backend "grouped_mm": `torch._grouped_mm`, saving only the
rows, gate x and up x). `grouped_swiglu` takes rows sorted by expert (expert parallel); `routed_swiglu` takes
the tokens and their `RoutedCopies`, gathering, computing and combining with no [T*k, H] tensor kept."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from lumina.model.config import MOE_BACKENDS


def grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `torch._grouped_mm(x [N, K], weight^T)` runs here: dtype, device and 16-byte row alignment."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != weight.dtype:
        return False
    cpu = x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    cuda = (x.device.type == "cuda" and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device)[0] >= 9)
    return (cpu or cuda) and all(d * x.element_size() % 16 == 0 for d in weight.shape[1:])


def _fused(backend: str, x: torch.Tensor, gate: torch.Tensor, down: torch.Tensor) -> bool:
    return backend == "grouped_mm" and grouped_mm_supported(x, gate) and grouped_mm_supported(x, down)


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """order int64 [N] (a permutation) -> its inverse [N]: inverse[order[n]] = n."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


COMBINE_CHUNK_BYTES = 16 * 2**20  # the combine's gathered copies at a time (any device: bytes not held)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the k copies are weighted and summed in: fp32, or wider when the activations are."""
    return torch.promote_types(dtype, torch.float32)


def sum_copies(rows: torch.Tensor, inverse: torch.Tensor, top_k: int,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """rows [T*k, W] in expert-sorted order (copy t*k + s at row inverse[t*k + s]) -> [T, W]: each token's k
    rows weighted by weights [T, k] in the accumulation dtype, or summed in rows' dtype; gathered in chunks."""
    num_tokens, width = inverse.numel() // top_k, rows.shape[1]
    acc = rows.dtype if weights is None else accumulation_dtype(rows.dtype)
    step = max(1, COMBINE_CHUNK_BYTES // (top_k * width * torch.finfo(acc).bits // 8))
    parts = []
    for start in range(0, max(num_tokens, 1), step):
        stop = min(start + step, num_tokens)
        copies = rows.index_select(0, inverse[start * top_k:stop * top_k]).view(-1, top_k, width)
        if weights is None:
            parts.append(copies.sum(dim=1))
        else:
            parts.append(torch.bmm(weights[start:stop].to(acc).unsqueeze(1), copies.to(acc)).squeeze(1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def row_weights(weights: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """weights [T, k] -> [T*k, 1]: the weight of each expert-sorted row (row n holds copy order[n])."""
    return weights.reshape(-1).index_select(0, order).unsqueeze(-1)


def combine_weight_grad(grad_out: torch.Tensor, out: torch.Tensor, order: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
    """The combine's one weight gradient d/dw[t, s] = <grad of token t, output of copy (t, s)>, from expert-sorted
    grad_out, out [T*k, W] (W = H, or I for the fused path's <down^T grad, hidden>) -> [T, k] in slot order."""
    acc = accumulation_dtype(out.dtype)
    per_row = torch.linalg.vecdot(grad_out.to(acc), out.to(acc))
    return per_row.new_empty(per_row.shape).index_copy_(0, order, per_row).view_as(weights).to(weights.dtype)


class _Combine(torch.autograd.Function):
    """`combine_copies`; saves rows in their own dtype (no fp32 copy), backward in the rows' order (no scatter)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weights: torch.Tensor, order: torch.Tensor,  # noqa: ANN001
                inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows, weights, order)
        return sum_copies(rows, inverse, weights.shape[1], weights).to(rows.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        rows, weights, order = ctx.saved_tensors
        upstream = grad.index_select(0, order // weights.shape[1]).float()  # each row's token gradient
        grad_w = combine_weight_grad(upstream, rows, order, weights) if ctx.needs_input_grad[1] else None
        return upstream.mul_(row_weights(weights, order)).to(rows.dtype), grad_w, None, None


def combine_copies(rows: torch.Tensor, topk_weights: torch.Tensor, order: torch.Tensor,
                   inverse: torch.Tensor) -> torch.Tensor:
    """rows [T * k, H] sorted by expert (row n holds copy order[n]; copy t*k + s sits at row inverse[t*k + s])
    -> sum_s w[t, s] * copy (t, s) [T, H] in rows' dtype, weighted and summed in fp32."""
    return _Combine.apply(rows, topk_weights.float(), order, inverse)


def reference_swiglu(rows: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                     tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """rows [N, H] sorted by expert (runs of sizes tokens_per_expert int [E]) -> [N, H]: down_e(silu(gate_e x)
    * up_e x) per run, one matmul per expert, autograd's own backward."""
    # unbind, not indexing: one stacked weight gradient instead of a full-size one per expert
    weights = zip(gate.unbind(0), up.unbind(0), down.unbind(0), strict=True)
    outs = [F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)
            for x, (g, u, d) in zip(rows.split(tokens_per_expert.tolist(), dim=0), weights, strict=True)]
    return torch.cat(outs, dim=0) if outs else rows.new_zeros(rows.shape)


def _gather(x: torch.Tensor, index: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H] -> x[index] [N, H], into `out` when given (x itself, contiguous, when index is None)."""
    if index is None:
        return x if x.stride() == (x.shape[1], 1) else x.new_empty(x.shape).copy_(x)  # e.g. an expanded grad
    return torch.index_select(x, 0, index, out=out)


def _swiglu_forward(x: torch.Tensor, index: torch.Tensor | None, gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows = x[index] (or x) [N, H] sorted by expert (int32 offsets [E]: run ends) -> (y [N, H], gate x
    [N, I], up x [N, I]); the gathered rows are freed before the down projection."""
    rows = _gather(x, index)
    g = torch._grouped_mm(rows, gate.transpose(-2, -1), offs=offsets)
    u = torch._grouped_mm(rows, up.transpose(-2, -1), offs=offsets)
    del rows
    return torch._grouped_mm(F.silu(g).mul_(u), down.transpose(-2, -1), offs=offsets), g, u


def _swiglu_backward(grad: torch.Tensor, x: torch.Tensor, index: torch.Tensor | None, gate: torch.Tensor,
                     up: torch.Tensor, down: torch.Tensor, offsets: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
                     needs: tuple[bool, ...], order: torch.Tensor | None = None,
                     weights: torch.Tensor | None = None) -> list[torch.Tensor | None]:
    """Gradients of (rows, weights, gate, up, down) of `_swiglu_forward(x, index, ...)`'s y from grad[index]
    (or grad) [N, H], each row n scaled by weights [T, k] at copy order[n] when given (on the I-wide tensors
    only; the weight gradient is <down_e^T grad_y, hidden_n>, no y kept). Overwrites g and u; reuses the
    buffers of grad_y and the hidden product instead of allocating new ones."""
    need_rows, need_w, need_gate, need_up, need_down = needs
    grad_w = grad_gate = grad_up = grad_down = grad_rows = hidden = None
    row_weight = None if weights is None else row_weights(weights, order)  # [N, 1]
    grad_y = _gather(grad, index)
    grad_hidden = torch._grouped_mm(grad_y, down, offs=offsets)  # [N, I]
    if need_w or need_down:
        hidden = F.silu(g).mul_(u)
        if need_w:
            grad_w = combine_weight_grad(grad_hidden, hidden, order, weights)  # [T, k]
        if need_down:
            if row_weight is not None:
                hidden.mul_(row_weight)
            grad_down = torch._grouped_mm(grad_y.t(), hidden, offs=offsets)  # [E, H, I]
    if row_weight is not None:
        grad_hidden.mul_(row_weight)
    grad_silu = torch.mul(grad_hidden, u, out=hidden)  # into the hidden product's buffer where there is one
    torch.ops.aten.silu.out(g, out=u)
    u.mul_(grad_hidden)  # u: d/d(up x)
    torch.ops.aten.silu_backward.grad_input(grad_silu, g, grad_input=g)  # g: d/d(gate x)
    del grad_silu, grad_hidden, hidden
    if need_gate or need_up:
        rows = _gather(x, index, out=None if index is None else grad_y)  # grad_y is spent
        grad_gate = torch._grouped_mm(g.t(), rows, offs=offsets) if need_gate else None  # [E, I, H]
        grad_up = torch._grouped_mm(u.t(), rows, offs=offsets) if need_up else None
        del rows
    del grad_y
    if need_rows:
        grad_rows = torch._grouped_mm(g, gate, offs=offsets)  # [N, H]
        grad_rows += torch._grouped_mm(u, up, offs=offsets)
    return [grad_rows, grad_w, grad_gate, grad_up, grad_down]


def _refuse_second_backward(ctx: torch.autograd.function.FunctionCtx) -> None:
    if getattr(ctx, "consumed", False):
        raise RuntimeError("the grouped SwiGLU experts' backward ran twice on one graph (retain_graph=True): its "
                           "first backward overwrote the saved activations with their gradients")
    ctx.consumed = True


class _GroupedSwiGLU(torch.autograd.Function):
    """rows [N, H] sorted by expert -> [N, H]; autograd's results through the three grouped GEMMs, to the bit."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,  # noqa: ANN001
                down: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        y, g, u = _swiglu_forward(rows, None, gate, up, down, offsets)
        ctx.save_for_backward(rows, gate, up, down, offsets, g, u)
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):  # noqa: ANN001, ANN205
        _refuse_second_backward(ctx)
        rows, gate, up, down, offsets, g, u = ctx.saved_tensors
        need_rows, need_gate, need_up, need_down, _ = ctx.needs_input_grad
        grad_rows, _, grad_gate, grad_up, grad_down = _swiglu_backward(
            grad_y, rows, None, gate, up, down, offsets, g, u, (need_rows, False, need_gate, need_up, need_down))
        return grad_rows, grad_gate, grad_up, grad_down, None


def grouped_swiglu(rows: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                   tokens_per_expert: torch.Tensor, backend: str = "grouped_mm") -> torch.Tensor:
    """rows [N, H] sorted by expert (runs of sizes tokens_per_expert int [E]) -> [N, H]."""
    if not _fused(backend, rows, gate, down):
        return reference_swiglu(rows, gate, up, down, tokens_per_expert)
    offsets = tokens_per_expert.cumsum(0).to(torch.int32)
    return _GroupedSwiGLU.apply(rows.contiguous(), gate, up, down, offsets)


@dataclass
class RoutedCopies:
    """The T*k routed copies of T tokens, for experts that gather their own rows and weigh their own outputs."""

    # int64 [T*k]: the flat (token, slot) index t*k + s of the copy at each expert-sorted row (token order kept
    # inside an expert)
    order: torch.Tensor
    weights: torch.Tensor  # fp32 [T, k]


class _RoutedSwiGLU(torch.autograd.Function):
    """`routed_swiglu`'s fused form: gather, `_swiglu_forward`, deterministic weighted combine. Saves x, the
    weights, the order, gate x and up x [T*k, I] (rows are re-gathered in the backward, the expert outputs
    not kept); recomputable under non-reentrant checkpointing."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,  # noqa: ANN001
                down: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        top_k = weights.shape[1]
        offsets = counts.cumsum(0).to(torch.int32)
        y, g, u = _swiglu_forward(x, order // top_k, gate, up, down, offsets)
        ctx.save_for_backward(x, weights, gate, up, down, order, offsets, g, u)
        return sum_copies(y, inverse_permutation(order), top_k, weights).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        _refuse_second_backward(ctx)
        x, weights, gate, up, down, order, offsets, g, u = ctx.saved_tensors
        top_k = weights.shape[1]
        grads = _swiglu_backward(grad, x, order // top_k, gate, up, down, offsets, g, u,
                                 tuple(ctx.needs_input_grad[:5]), order, weights)
        if grads[0] is not None:
            grads[0] = sum_copies(grads[0], inverse_permutation(order), top_k).to(x.dtype)
        return (*grads, None, None)


def routed_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                  tokens_per_expert: torch.Tensor, copies: RoutedCopies, backend: str = "grouped_mm") -> torch.Tensor:
    """x [T, H] tokens; copies.order [T*k] sorted by expert (runs of sizes tokens_per_expert int [E]) ->
    sum_s w[t, s] * expert_{e(t, s)}(x[t]) [T, H] in x's dtype, weighted and summed in fp32."""
    if _fused(backend, x, gate, down):
        return _RoutedSwiGLU.apply(x, copies.weights, gate, up, down, copies.order, tokens_per_expert)
    rows = reference_swiglu(x.index_select(0, copies.order // copies.weights.shape[1]), gate, up, down,
                            tokens_per_expert)
    return combine_copies(rows, copies.weights, copies.order, inverse_permutation(copies.order))


def experts_per_rank(num_experts: int, ep: int) -> int:
    """The experts each of `ep` expert-parallel ranks holds; ValueError unless ep divides num_experts."""
    if num_experts % ep:
        raise ValueError(f"num_experts={num_experts} is not divisible by the expert-parallel size ep={ep}")
    return num_experts // ep


class GroupedExperts(nn.Module):
    def __init__(self, num_local_experts: int, hidden_size: int, intermediate_size: int, backend: str = "grouped_mm",
                 std: float = 0.02) -> None:
        super().__init__()
        if backend not in MOE_BACKENDS:
            raise ValueError(f"GroupedExperts.backend={backend!r}: must be one of {MOE_BACKENDS}")
        self.num_local_experts = num_local_experts
        self.backend = backend
        self.std = std
        self.gate_proj = nn.Parameter(torch.empty(num_local_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_local_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_local_experts, hidden_size, intermediate_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, std); sharded over expert-parallel ranks, each rank draws its own slice."""
        with torch.no_grad():
            for weight in self.projections():
                weight.normal_(mean=0.0, std=self.std)

    def projections(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate, up, down) of this rank's experts: the local slices where expert parallelism made the
        parameters DTensors (`lumina.distributed.shard_experts`), else the parameters."""
        return tuple(w.to_local() if isinstance(w, DTensor) else w  # type: ignore[return-value]
                     for w in (self.gate_proj, self.up_proj, self.down_proj))

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                copies: RoutedCopies | None = None) -> torch.Tensor:
        """x [N, H] sorted by local expert; tokens_per_expert int [E_local] summing to N -> [N, H]. With
        `copies`: x [T, H] tokens, tokens_per_expert counting their T*k copies -> the weighted sum [T, H]."""
        if tokens_per_expert.shape != (self.num_local_experts,):
            raise ValueError(f"tokens_per_expert has shape {list(tokens_per_expert.shape)}, expected "
                             f"[{self.num_local_experts}] (the local experts)")
        if copies is None:
            return grouped_swiglu(x, *self.projections(), tokens_per_expert, self.backend)
        return routed_swiglu(x, *self.projections(), tokens_per_expert, copies, self.backend)
