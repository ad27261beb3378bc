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


@dataclass
class _LocalContext:
    inverse: torch.Tensor  # [T * k]: position of each (token, slot) copy in the expert-grouped order
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
        return x[order // top_k], tokens_per_expert, _LocalContext(inverse, num_tokens, top_k)

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: _LocalContext) -> torch.Tensor:
        per_copy = y_local[ctx.inverse].view(ctx.num_tokens, ctx.top_k, -1)  # [T, k, H] in (token, slot) order
        out = (per_copy.float() * topk_weights.float().unsqueeze(-1)).sum(dim=1)
        return out.to(y_local.dtype)
