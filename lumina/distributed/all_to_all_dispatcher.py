"""`AllToAllDispatcher`: the expert-parallel `lumina.model.moe_dispatch.MoEDispatcher`.

run_experts sorts the T*k routed copies by global expert id (ep rank r owns [r*E_local, (r+1)*E_local)),
exchanges the per-expert counts (the layer's one host sync), all-to-alls the rows to their experts' ranks,
regroups them by local expert, runs the experts and undoes every step, then sums the k slots in fp32
(`combine_copies`). Every step is differentiable.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lumina.distributed.all_to_all import all_to_all
from lumina.model.experts import combine_copies, experts_per_rank, inverse_permutation
from lumina.model.moe_dispatch import group_by_expert


class AllToAllDispatcher:
    """group: the expert-parallel process group (ep ranks, experts split evenly in rank order)."""

    def __init__(self, group: dist.ProcessGroup, num_experts: int) -> None:
        self.group = group
        self.ep = dist.get_world_size(group)
        self.num_experts = num_experts
        self.num_local = experts_per_rank(num_experts, self.ep)

    def splits(self, counts: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        """counts int64 [E] sent to each expert -> (received [ep * E_local], from rank r for local expert j at
        r*E_local + j; send splits; receive splits). The one host sync."""
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        splits = torch.stack([counts.view(self.ep, self.num_local).sum(1),
                              received.view(self.ep, self.num_local).sum(1)])
        send_splits, recv_splits = splits.tolist()
        return received, send_splits, recv_splits

    def run_experts(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: nn.Module) -> torch.Tensor:
        """x [T, H], topk_ids [T, k], topk_weights [T, k] -> y [T, H] in x's dtype (`experts`: this rank's
        E_local experts, called on rows sorted by local expert)."""
        top_k = topk_ids.shape[1]
        order, counts = group_by_expert(topk_ids, self.num_experts)
        received, send_splits, recv_splits = self.splits(counts)
        rows = all_to_all(x.index_select(0, order // top_k), recv_splits, send_splits, self.group)
        local_expert = torch.arange(self.num_local, device=x.device).repeat(self.ep)
        regroup = local_expert.repeat_interleave(received, output_size=rows.shape[0]).argsort(stable=True)
        y_local = experts(rows[regroup], received.view(self.ep, self.num_local).sum(0))
        back = all_to_all(y_local[inverse_permutation(regroup)], send_splits, recv_splits, self.group)
        return combine_copies(back, topk_weights, order, inverse_permutation(order))
