"""The MoE dispatcher seam: how routed token copies reach the (possibly remote) experts and come back.

Protocol (an object held as `moe.dispatcher`, replaceable, e.g. by an expert-parallel all-to-all one):

    dispatch(x [T, H], topk_ids int64 [T, k], num_experts) -> (x_local [N, H], tokens_per_expert [E_local], ctx)
        rows of x_local are grouped by local expert (contiguous, in local-expert order) for
        `GroupedExperts(x_local, tokens_per_expert)`;
    combine(y_local [N, H], topk_weights fp32 [T, k], ctx) -> y [T, H] in y_local's dtype
        sum_k w[t, k] * expert_{topk_ids[t, k]}(x[t]), the weighting and sum done in fp32.

Optional (`MoE` prefers it when the dispatcher has it, `run_routed_experts`):

    run_experts(x [T, H], topk_ids int64 [T, k], topk_weights fp32 [T, k], experts) -> y [T, H] in x's dtype
        the same sum as dispatch -> experts -> combine, computed as one step (the local dispatcher hands the
        experts `RoutedCopies`: they gather their own rows and weigh their own outputs, and autograd keeps no
        [T * k, H] tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from lumina.model.experts import RoutedCopies

# largest CPU temporary the local dispatcher (and the experts it drives) builds at once: 4x under glibc's mmap
# threshold, and large enough that a layer's CPU work is a few blocks (each small op is an OpenMP region whose
# barrier costs milliseconds when another process holds a core)
DISPATCH_CHUNK_BYTES = 8 * 2**20


class MoEDispatcher(Protocol):
    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor, Any]: ...

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: Any) -> torch.Tensor: ...


def run_routed_experts(dispatcher: MoEDispatcher, x: torch.Tensor, topk_ids: torch.Tensor,
                       topk_weights: torch.Tensor, experts: nn.Module, num_experts: int) -> torch.Tensor:
    """x [T, H] -> sum_k w[t, k] * expert_{topk_ids[t, k]}(x[t]) [T, H]: the dispatcher's `run_experts` where
    it has one, else dispatch -> experts -> combine."""
    run_experts = getattr(dispatcher, "run_experts", None)
    if run_experts is not None:
        return run_experts(x, topk_ids, topk_weights, experts)
    x_local, tokens_per_expert, ctx = dispatcher.dispatch(x, topk_ids, num_experts)
    return dispatcher.combine(experts(x_local, tokens_per_expert), topk_weights, ctx)


class _GatherCopies(torch.autograd.Function):
    """x [T, H] -> x[order // k] [T * k, H]. Backward gathers each token's k copies with the inverse
    permutation and sums them, `step` tokens at a time (no scatter-add)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor,  # noqa: ANN001
                top_k: int, step: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.top_k, ctx.step = top_k, step
        return x.index_select(0, order // top_k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (inverse,) = ctx.saved_tensors
        k, step, hidden = ctx.top_k, ctx.step, grad.shape[-1]
        num_tokens = inverse.numel() // k
        grad_x = grad.new_empty(num_tokens, hidden)
        for start in range(0, num_tokens, step):
            stop = min(start + step, num_tokens)
            copies = grad.index_select(0, inverse[start * k:stop * k]).view(-1, k, hidden)
            torch.sum(copies, dim=1, out=grad_x[start:stop])
        return grad_x, None, None, None, None


class _Combine(torch.autograd.Function):
    """(y_local [N, H], weights fp32 [T, k]) -> sum_k w[t, k] * y_local[inverse[t * k + k']] [T, H], weighted
    and summed in fp32, returned in y_local's dtype, `step` tokens at a time. Backward works in y_local's row
    order: grad_y[n] = w[order[n]] * grad[order[n] // k] (no scatter)."""

    @staticmethod
    def forward(ctx, y_local: torch.Tensor, weights: torch.Tensor, order: torch.Tensor,  # noqa: ANN001
                inverse: torch.Tensor, step: int) -> torch.Tensor:
        ctx.save_for_backward(y_local, weights, order)
        ctx.step = step
        num_tokens, k = weights.shape
        hidden = y_local.shape[-1]
        out = torch.empty(num_tokens, hidden, dtype=torch.float32, device=y_local.device)
        for start in range(0, num_tokens, step):
            stop = min(start + step, num_tokens)
            copies = y_local.index_select(0, inverse[start * k:stop * k]).view(-1, k, hidden).float()
            torch.bmm(weights[start:stop].unsqueeze(1), copies, out=out[start:stop].unsqueeze(1))
        return out.to(y_local.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        y_local, weights, order = ctx.saved_tensors
        k = weights.shape[1]
        weight_of_row = weights.reshape(-1).index_select(0, order)  # [N] fp32
        grad_y = torch.empty_like(y_local)
        grad_w_of_row = torch.empty_like(weight_of_row) if ctx.needs_input_grad[1] else None
        rows_per_chunk = ctx.step * k
        fp32 = grad.dtype == grad_y.dtype == torch.float32
        for start in range(0, order.numel(), rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            tokens = order[rows] // k
            # [c, H] fp32: each row's token gradient (gathered straight into grad_y when that is fp32)
            upstream = (torch.index_select(grad, 0, tokens, out=grad_y[rows]) if fp32
                        else grad.index_select(0, tokens).float())
            if grad_w_of_row is not None:
                torch.linalg.vecdot(upstream, y_local[rows].float(), out=grad_w_of_row[rows])
            upstream.mul_(weight_of_row[rows].unsqueeze(-1))
            if not fp32:
                grad_y[rows] = upstream
        grad_w = None
        if grad_w_of_row is not None:
            grad_w = torch.empty_like(grad_w_of_row).index_copy_(0, order, grad_w_of_row).view_as(weights)
        return grad_y, grad_w, None, None, None


def tokens_per_chunk(x: torch.Tensor, top_k: int, cpu_chunk_bytes: int = DISPATCH_CHUNK_BYTES) -> int:
    """Tokens of x [T, H] whose k fp32 copies fit `cpu_chunk_bytes` on CPU (all T elsewhere)."""
    num_tokens, hidden = x.shape
    if x.device.type != "cpu":
        return max(num_tokens, 1)
    return max(1, cpu_chunk_bytes // (top_k * hidden * 4))  # fp32 temporaries


def combine_copies(rows: torch.Tensor, topk_weights: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor,
                   step: int) -> torch.Tensor:
    """rows [T * k, H] grouped by expert (row n holds copy order[n]; copy t * k + s sits at row inverse[t * k + s])
    -> sum_s w[t, s] * copy (t, s) [T, H] in rows' dtype, weighted and summed in fp32, `step` tokens at a time;
    autograd keeps rows in their own dtype, the weights and `order`."""
    return _Combine.apply(rows, topk_weights.float(), order, inverse, step)


def _group_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (order int64 [T * k]: the flat (token, slot) copies grouped by expert, token order kept
    inside a group; tokens_per_expert int64 [E])."""
    flat = topk_ids.reshape(-1)
    return flat.argsort(stable=True), torch.bincount(flat, minlength=num_experts)


@dataclass
class _LocalContext:
    order: torch.Tensor  # [T * k]: (token, slot) copy at each expert-grouped position
    inverse: torch.Tensor  # [T * k]: expert-grouped position of each (token, slot) copy
    step: int  # tokens per chunk of the per-copy temporaries


class LocalDispatcher:
    """All experts live on this device (E_local = E, offset 0): permute copies by expert id, unpermute back.

    `cpu_chunk_bytes`: on CPU, the per-copy temporaries of the combine and of the gather's backward, and the
    block buffers of `run_experts`' experts, are built a chunk of tokens (rows) at a time, each at most this size.
    Fresh CPU tensors above glibc's mmap threshold (32 MiB) page-fault on every allocation (about 25 ms per
    64 MiB on a 2-core CPU, several times the copy itself); chunks below it reuse heap memory. The CUDA caching
    allocator has no such cost: there they are built whole."""

    def __init__(self, cpu_chunk_bytes: int = DISPATCH_CHUNK_BYTES) -> None:
        if cpu_chunk_bytes < 1:
            raise ValueError(f"LocalDispatcher.cpu_chunk_bytes={cpu_chunk_bytes}: must be >= 1")
        self.cpu_chunk_bytes = cpu_chunk_bytes

    def tokens_per_chunk(self, x: torch.Tensor, top_k: int) -> int:
        return tokens_per_chunk(x, top_k, self.cpu_chunk_bytes)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor, _LocalContext]:
        top_k = topk_ids.shape[1]
        order, tokens_per_expert = _group_by_expert(topk_ids, num_experts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        step = self.tokens_per_chunk(x, top_k)
        x_local = _GatherCopies.apply(x, order, inverse, top_k, step)
        return x_local, tokens_per_expert, _LocalContext(order, inverse, step)

    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor:
        """x [T, H], topk_ids [T, k], topk_weights [T, k] -> y [T, H] in x's dtype: `experts` (a
        `GroupedExperts`-like module holding all experts) gather the copies, compute and weigh them in one
        autograd step that keeps no [T * k, H] tensor (`lumina.model.experts.routed_swiglu`)."""
        order, tokens_per_expert = _group_by_expert(topk_ids, experts.num_local_experts)
        return experts(x, tokens_per_expert, RoutedCopies(order, topk_weights.float(), self.cpu_chunk_bytes))

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: _LocalContext) -> torch.Tensor:
        return combine_copies(y_local, topk_weights, ctx.order, ctx.inverse, ctx.step)
