"""The MoE dispatcher seam: how routed token copies reach the (possibly remote) experts and come back.

Protocol (an object held as `moe.dispatcher`, replaceable, e.g. by the expert-parallel all-to-all one):

    run_experts(x [T, H], topk_ids int64 [T, k], topk_weights fp32 [T, k], experts) -> y [T, H] in x's dtype
        sum_k w[t, k] * expert_{topk_ids[t, k]}(x[t]), the weighting and sum done in fp32.

`LocalDispatcher` (all experts on this device) hands the experts the tokens and their `RoutedCopies`: they
gather, compute and weigh in one step. The expert-parallel dispatcher sorts the copies (`group_by_expert`),
all-to-alls them between the gather and the experts' grouped SwiGLU and back, and sums them
(`combine_copies`)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from lumina.model.experts import RoutedCopies, sum_copies


class MoEDispatcher(Protocol):
    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor: ...


def group_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (order int64 [T * k]: the flat (token, slot) copies sorted by expert, token order kept
    inside an expert; tokens_per_expert int64 [E])."""
    flat = topk_ids.reshape(-1)
    return flat.argsort(stable=True), torch.bincount(flat, minlength=num_experts)


class _Combine(torch.autograd.Function):
    """(rows [T*k, H] sorted by expert, weights fp32 [T, k]) -> sum_s w[t, s] * rows[inverse[t*k + s]] [T, H],
    weighted and summed in fp32, returned in rows' dtype. Saves rows in their own dtype (no fp32 copy).
    Backward works in the rows' order: grad_rows[n] = w[order[n]] * grad[order[n] // k] (no scatter)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weights: torch.Tensor, order: torch.Tensor,  # noqa: ANN001
                inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows, weights, order)
        return sum_copies(rows, inverse, weights.shape[1], weights).to(rows.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        rows, weights, order = ctx.saved_tensors
        weight_of_row = weights.reshape(-1).index_select(0, order).unsqueeze(-1)  # [T*k, 1] fp32
        upstream = grad.index_select(0, order // weights.shape[1]).float()  # each row's token gradient
        grad_w = None
        if ctx.needs_input_grad[1]:
            per_row = torch.linalg.vecdot(upstream, rows.float())
            grad_w = torch.empty_like(per_row).index_copy_(0, order, per_row).view_as(weights)
        return upstream.mul_(weight_of_row).to(rows.dtype), grad_w, None, None


def combine_copies(rows: torch.Tensor, topk_weights: torch.Tensor, order: torch.Tensor,
                   inverse: torch.Tensor) -> torch.Tensor:
    """rows [T * k, H] sorted by expert (row n holds copy order[n]; copy t*k + s sits at row inverse[t*k + s])
    -> sum_s w[t, s] * copy (t, s) [T, H] in rows' dtype, weighted and summed in fp32."""
    return _Combine.apply(rows, topk_weights.float(), order, inverse)


class LocalDispatcher:
    """All experts live on this device: the experts gather the copies, compute and weigh them in one autograd
    step that keeps no [T * k, H] tensor (`lumina.model.experts.routed_swiglu`)."""

    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor:
        """x [T, H], topk_ids [T, k], topk_weights [T, k] -> y [T, H] in x's dtype (`experts`: a
        `GroupedExperts`-like module holding all experts)."""
        order, tokens_per_expert = group_by_expert(topk_ids, experts.num_local_experts)
        return experts(x, tokens_per_expert, RoutedCopies(order, topk_weights.float()))
