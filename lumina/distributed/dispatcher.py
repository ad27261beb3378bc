"""`AllToAllDispatcher`: the expert-parallel implementation of the model's MoE dispatcher seam
(`lumina.model.dispatch.MoEDispatcher`).

dispatch: the T*k routed copies are sorted by global expert id (experts of ep rank r are
[r*E_local, (r+1)*E_local)), the per-expert counts are exchanged (one small all-to-all), the split sizes are
read to the host (the one host sync of the layer), the rows are all-to-all'd to the ranks owning their
experts and regrouped by local expert for `GroupedExperts`-style compute. combine: the exact inverse (regroup,
all-to-all back) and the fp32 weighted sum over the k slots (`combine_copies`, as the local dispatcher's). Every
step is differentiable. No `run_experts`: the MoE takes dispatch -> experts -> combine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from lumina.distributed.all_to_all import all_to_all
from lumina.model.dispatch import combine_copies, tokens_per_chunk


@dataclass
class _Context:
    order: torch.Tensor  # [T * k]: (token, slot) copy at each position of the expert-sorted send order
    inverse: torch.Tensor  # [T * k]: position of each (token, slot) copy in the expert-sorted send order
    regroup: torch.Tensor  # [N]: received-row index of each row of the expert-grouped local order
    send_splits: list[int]
    recv_splits: list[int]
    step: int  # tokens per chunk of the combine's per-copy temporaries


class AllToAllDispatcher:
    """group: the expert-parallel process group (ep ranks, experts split evenly in rank order)."""

    def __init__(self, group: dist.ProcessGroup, num_experts: int) -> None:
        self.group = group
        self.ep = dist.get_world_size(group)
        if num_experts % self.ep:
            raise ValueError(f"num_experts={num_experts} is not divisible by the expert-parallel size {self.ep}")
        self.num_experts = num_experts
        self.num_local = num_experts // self.ep
        self.host_syncs = 0  # dispatch calls that read split sizes to the host (one each)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor,
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor, _Context]:
        """x [T, H], topk_ids [T, k] -> (rows for the local experts [N, H] grouped by local expert,
        tokens_per_expert [E_local], ctx)."""
        if num_experts != self.num_experts:
            raise ValueError(f"dispatch got num_experts={num_experts}, the dispatcher was built for "
                             f"{self.num_experts}")
        num_tokens, top_k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        order = flat.argsort(stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        counts = torch.bincount(flat, minlength=num_experts)  # [E] copies this rank sends to each expert
        received = torch.empty_like(counts)  # [ep * E_local]: from rank r for local expert j at r*E_local + j
        dist.all_to_all_single(received, counts, group=self.group)
        splits = torch.stack([counts.view(self.ep, self.num_local).sum(1),
                              received.view(self.ep, self.num_local).sum(1)])
        send_splits, recv_splits = splits.tolist()  # the one host sync
        self.host_syncs += 1
        rows = all_to_all(x[order // top_k], recv_splits, send_splits, self.group)  # [N, H] by (source, expert)
        local_expert = torch.arange(self.num_local, device=x.device).repeat(self.ep)
        expert_of_row = local_expert.repeat_interleave(received, output_size=rows.shape[0])
        regroup = expert_of_row.argsort(stable=True)
        tokens_per_expert = received.view(self.ep, self.num_local).sum(0)
        ctx = _Context(order, inverse, regroup, send_splits, recv_splits, tokens_per_chunk(x, top_k))
        return rows[regroup], tokens_per_expert, ctx

    def combine(self, y_local: torch.Tensor, topk_weights: torch.Tensor, ctx: _Context) -> torch.Tensor:
        """y_local [N, H] in the dispatch order -> y [T, H]: sum_k w[t, k] * expert(x[t]) in fp32, cast back
        (the local dispatcher's combine on the returned expert-sorted copies: it keeps them in their own dtype)."""
        undo = torch.empty_like(ctx.regroup)
        undo[ctx.regroup] = torch.arange(ctx.regroup.numel(), device=undo.device)
        rows = all_to_all(y_local[undo], ctx.send_splits, ctx.recv_splits, self.group)  # expert-sorted copies
        return combine_copies(rows, topk_weights, ctx.order, ctx.inverse, ctx.step)
