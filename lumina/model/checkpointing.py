"""Activation checkpointing of the backbone (`LuminaConfig.gradient_checkpointing`), with every router's
top-k replayed on recompute.

A recompute could select other experts than the forward did (another kernel, bf16 reductions, an expert bias
changed in between); the dispatch would then split tokens differently from the saved activations.
`Checkpointer` runs a function under non-reentrant `torch.utils.checkpoint` with a `RoutingTape` per call:
the forward records the top-k ids of every router the call runs, the recompute replays them in the same
order. In both passes the weights are re-gathered from the scores at the final ids, so both passes build
the same graph and the gradients equal those of the `none` policy bit for bit, on one device or under FSDP2.
Recompute updates no load counters (the backbone counts them outside the checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from lumina.model.router import Router, Routing


class RoutingTape:
    """The top-k ids [T, k] of the routers one checkpointed call ran, in call order."""

    def __init__(self) -> None:
        self.ids: list[torch.Tensor] = []
        self.cursor: int | None = None  # None while recording; else the next entry to replay

    def rewind(self) -> None:
        """Start replaying from the first recorded entry (each recompute replays the whole tape)."""
        self.cursor = 0

    def take(self, ids: torch.Tensor) -> torch.Tensor:
        """Record `ids` [T, k] (forward) or return the recorded ids in their place (recompute)."""
        if self.cursor is None:
            self.ids.append(ids.detach())
            return ids
        if self.cursor >= len(self.ids):
            raise RuntimeError("activation-checkpoint recompute ran a router the forward did not run "
                               f"({len(self.ids)} recorded)")
        recorded = self.ids[self.cursor]
        self.cursor += 1
        return recorded.to(ids.device)


class _TapeContext:
    """Makes `tape` the checkpointer's active tape (recording, or replaying from its start) while entered."""

    def __init__(self, owner: Checkpointer, tape: RoutingTape, replay: bool) -> None:
        self.owner, self.tape, self.replay = owner, tape, replay
        self.previous: RoutingTape | None = None

    def __enter__(self) -> None:
        if self.replay:
            self.tape.rewind()
        self.previous, self.owner.tape = self.owner.tape, self.tape

    def __exit__(self, *exc: object) -> None:
        self.owner.tape = self.previous


class Checkpointer:
    """`checkpointer(fn, *args)` = `fn(*args)` under non-reentrant checkpointing; forward hooks on `routers`
    record / replay their top-k inside such calls and leave every other call alone."""

    def __init__(self, routers: Iterable[Router]) -> None:
        self.tape: RoutingTape | None = None
        self.handles: list[RemovableHandle] = [r.register_forward_hook(self._route) for r in routers]

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        return checkpoint(fn, *args, use_reentrant=False, context_fn=self._contexts)

    def _contexts(self) -> tuple[_TapeContext, _TapeContext]:
        """(forward context, recompute context) of one checkpointed call, sharing one fresh tape."""
        tape = RoutingTape()
        return _TapeContext(self, tape, replay=False), _TapeContext(self, tape, replay=True)

    def _route(self, router: Router, args: object, routing: Routing) -> Routing | None:
        """Router forward hook: the recorded ids in a recompute, the weights re-gathered in both passes."""
        tape = self.tape
        if tape is None:
            return None
        ids = tape.take(routing.topk_ids)
        weights = router.weigh(routing.logits.sigmoid(), ids)
        return Routing(logits=routing.logits, topk_ids=ids, topk_weights=weights)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
