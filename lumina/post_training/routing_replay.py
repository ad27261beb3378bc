"""Routing replay between the rollout's policy and the update (R3, `objective.post_training.routing`).

An MoE policy that moves between its rollout and its update, or routes with training-mode noise, can send a
token to other experts in the update than the rollout's policy did: the likelihood ratio then mixes a policy
change with a routing change. `RoutingReplay.recording` runs the rollout policy's scoring pass over an inner
epoch's views (the same masks, from the stored seeds) and keeps every router's top-k ids on a `RoutingTape`, in
forward order; `RoutingReplay.replaying` runs the update's pass over the same views and compares each router's
fresh top-k with the recorded one (`Divergence`) and, with `replace`, routes by the recorded ids (the combine
weights recomputed at them by `MoERouter.weigh`, so gradients reach the router). The hooks run before
activation checkpointing's own: inside a checkpointed call that one weighs the replayed ids, records them and
replays them on recompute (which runs after these hooks are gone), so the forward and its recompute do the same
work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from lumina.model.activation_checkpointing import RoutingTape, checkpointer_of
from lumina.model.routers import MoERouter, Routing
from lumina.post_training.losses import global_ratio

ROUTING_MODES = ("none", "compare", "replay")


@dataclass
class Divergence:
    """Top-k slots compared so far: `differ` of `slots` held an expert the recorded top-k of its token lacks."""

    differ: torch.Tensor
    slots: torch.Tensor

    def share(self, group: dist.ProcessGroup | None) -> torch.Tensor:
        """The share over every rank's slots (0 with none)."""
        return global_ratio(self.differ, self.slots, self.differ.device, group)


class RoutingReplay:
    """Record-then-replay of every router of `model` (ValueError naming the setting when it has none)."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = [m for m in model.modules() if isinstance(m, MoERouter)]
        self.checkpointer = checkpointer_of(model)
        if not self.routers:
            raise ValueError("objective.post_training.routing: the model has no MoE router to record or replay")

    @contextmanager
    def recording(self) -> Iterator[RoutingTape]:
        """While entered, every router's top-k ids [T, k] are appended to the yielded tape."""
        tape = RoutingTape()

        def hook(router: MoERouter, args: object, routing: Routing) -> None:
            tape.take(routing.topk_ids)

        with self._hooked(hook):
            yield tape

    @contextmanager
    def replaying(self, tape: RoutingTape, replace: bool) -> Iterator[Divergence]:
        """While entered, each router call takes the tape's next entry: compared with the fresh top-k into the
        yielded `Divergence` and, with `replace`, routed by instead. RuntimeError when the forwards differ
        from the recorded ones (another router call count or token count)."""
        tape.cursor = 0
        divergence = Divergence(torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64))

        def hook(router: MoERouter, args: object, routing: Routing) -> Routing | None:
            fresh = routing.topk_ids
            recorded = tape.take(fresh)
            if recorded.shape != fresh.shape:
                raise RuntimeError(f"routing replay: a router routed {list(fresh.shape)} top-k ids where the "
                                   f"recorded pass had {list(recorded.shape)}: the views differ")
            found = (fresh.unsqueeze(-1) == recorded.unsqueeze(-2)).any(-1)  # [T, k]
            divergence.differ = divergence.differ.to(fresh.device) + (~found).sum()
            divergence.slots = divergence.slots.to(fresh.device) + found.numel()
            if not replace:
                return None
            if self.checkpointer is not None and self.checkpointer.active:  # it weighs the ids it is handed
                return Routing(logits=routing.logits, topk_ids=recorded, topk_weights=routing.topk_weights)
            return Routing(logits=routing.logits, topk_ids=recorded,
                           topk_weights=router.weigh(routing.logits, recorded))

        with self._hooked(hook):
            yield divergence
        if tape.cursor != len(tape.ids):
            raise RuntimeError(f"routing replay: {tape.cursor} router calls replayed, {len(tape.ids)} recorded")

    @contextmanager
    def _hooked(self, hook) -> Iterator[None]:  # noqa: ANN001
        handles = [r.register_forward_hook(hook, prepend=True) for r in self.routers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
