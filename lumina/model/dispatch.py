"""The MoE dispatcher seam: how routed token copies reach the (possibly remote) experts and come back.

Protocol (an object held as `moe.dispatcher`, replaceable, e.g. by an expert-parallel all-to-all one):

    dispatch(x [T, H], topk_ids int64 [T, k], num_experts) -> (x_local [N, H], tokens_per_expert [E_local], ctx)
        rows of x_local are grouped by local expert (contiguous, in local-expert order) for
        `GroupedExperts(x_local, tokens_per_expert)`;
    combine(y_local [N, H], topk_weights fp32 [T, k], ctx) -> y [T, H] in y_local's dtype
        sum_k w[t, k] * expert_{topk_ids[t, k]}(x[t]), the weighting and sum done in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class MoEDispatcher(Protocol):
    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor, Any]: ...

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: Any) -> torch.Tensor: ...


class _GatherCopies(torch.autograd.Function):
    """x [T, H] -> x[order // k] [T * k, H]. Backward gathers with the inverse permutation and sums the k
    copies of each token (no scatter-add)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor,  # noqa: ANN001
                top_k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return x.index_select(0, order // top_k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (inverse,) = ctx.saved_tensors
        per_copy = grad.index_select(0, inverse)
        return per_copy.view(-1, ctx.top_k, per_copy.shape[-1]).sum(1), None, None, None


class _Permute(torch.autograd.Function):
    """y [N, H] -> y[index] for a permutation `index`; backward gathers with its inverse (no scatter)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(inverse)
        return y.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


@dataclass
class _LocalContext:
    order: torch.Tensor  # [T * k]: (token, slot) copy at each expert-grouped position
    inverse: torch.Tensor  # [T * k]: expert-grouped position of each (token, slot) copy
    num_tokens: int
    top_k: int


class LocalDispatcher:
    """All experts live on this device (E_local = E, offset 0): permute copies by expert id, unpermute back."""

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor, _LocalContext]:
        num_tokens, top_k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        order = flat.argsort(stable=True)  # copies grouped by expert, token order kept inside a group
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        tokens_per_expert = torch.bincount(flat, minlength=num_experts)
        x_local = _GatherCopies.apply(x, order, inverse, top_k)
        return x_local, tokens_per_expert, _LocalContext(order, inverse, num_tokens, top_k)

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: _LocalContext) -> torch.Tensor:
        per_copy = _Permute.apply(y_local, ctx.inverse, ctx.order).view(ctx.num_tokens, ctx.top_k, -1)
        out = torch.bmm(topk_weights.float().unsqueeze(1), per_copy.float()).squeeze(1)  # fp32 [T, H]
        return out.to(y_local.dtype)
