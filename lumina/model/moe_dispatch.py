"""The MoE dispatcher seam: how routed token copies reach the (possibly remote) experts and come back.

Protocol of `moe.dispatcher` (replaceable, e.g. by the expert-parallel all-to-all one): run_experts(x [T, H],
topk_ids int64 [T, k], topk_weights fp32 [T, k], experts) -> y [T, H] in x's dtype, sum_k w[t, k] *
expert_{topk_ids[t, k]}(x[t]) weighted and summed in fp32."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from lumina.model.experts import RoutedCopies


class MoEDispatcher(Protocol):
    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor: ...


def group_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (order int64 [T * k]: the flat (token, slot) copies sorted by expert, token order kept
    inside an expert; tokens_per_expert int64 [E])."""
    flat = topk_ids.reshape(-1)
    return flat.argsort(stable=True), torch.bincount(flat, minlength=num_experts)


class LocalDispatcher:
    """All experts on this device, gathering, computing and weighing the copies in one step (`routed_swiglu`)."""

    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor:
        """The protocol's `run_experts`; `experts`: a `GroupedExperts`-like module holding all experts."""
        order, tokens_per_expert = group_by_expert(topk_ids, experts.num_local_experts)
        return experts(x, tokens_per_expert, RoutedCopies(order, topk_weights.float()))
