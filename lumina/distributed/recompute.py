"""Activation checkpointing that replays the router's top-k on recompute.

The backbone recomputes each decoder layer in backward (`gradient_checkpointing`, non-reentrant). Bitwise
different recomputed router scores (another kernel, bf16 reductions) could select other experts than the
forward did; then the expert all-to-all splits and the saved activations disagree. `RoutingReplay` records
every router's top-k ids in the forward and, inside backward, replaces the recomputed ids with the recorded
ones (FIFO per router); in both passes the weights are re-gathered from the scores at the final ids, so the
forward and the recompute build the same graph. Recompute updates no load counters (they are counted
outside the checkpoint) and no participation records.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lumina.distributed.participation import in_backward
from lumina.model.router import Router, Routing


class RoutingReplay:
    def __init__(self, root: nn.Module) -> None:
        self.routers = [m for m in root.modules() if isinstance(m, Router)]
        self.queues: dict[int, deque[torch.Tensor]] = {id(r): deque() for r in self.routers}
        self.replayed = 0  # recomputes served from the record
        self.handles: list[RemovableHandle] = [root.register_forward_pre_hook(self._reset)]
        self.handles += [r.register_forward_hook(self._hook) for r in self.routers]

    def _reset(self, module: nn.Module, args: object) -> None:
        if not in_backward():
            for queue in self.queues.values():
                queue.clear()

    def _hook(self, router: Router, args: object, routing: Routing) -> Routing:
        queue = self.queues[id(router)]
        if in_backward():
            if not queue:
                raise RuntimeError("activation-checkpoint recompute of a router with no recorded top-k "
                                   "(forward and backward out of step)")
            ids = queue.popleft().to(routing.topk_ids.device)
            self.replayed += 1
        else:
            ids = routing.topk_ids
            if torch.is_grad_enabled():
                queue.append(ids.detach())
        weights = router.weigh(routing.logits.sigmoid(), ids)
        return Routing(logits=routing.logits, topk_ids=ids, topk_weights=weights)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
