"""Activation checkpointing (`LuminaConfig.gradient_checkpointing`), applied to a built model from outside its
layers' code by `apply_checkpointing` (as torchtitan's apply_ac), with every router's top-k replayed on
recompute.

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
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from lumina.model.config import checkpoint_policy
from lumina.model.router import Router, Routing

CHANNEL_CHECKPOINT_ROWS = 128  # image rows per checkpointed chunk of the channel head (policies full, selective)


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

    @torch.compiler.disable
    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        return checkpoint(fn, *args, use_reentrant=False, context_fn=self._contexts)

    def _contexts(self) -> tuple[_TapeContext, _TapeContext]:
        """(forward context, recompute context) of one checkpointed call, sharing one fresh tape."""
        tape = RoutingTape()
        return _TapeContext(self, tape, replay=False), _TapeContext(self, tape, replay=True)

    def _route(self, router: Router, args: object, routing: Routing) -> Routing | None:
        """Router forward hook: the recorded ids in a recompute, the weights re-gathered in both passes. Outside
        a checkpointed call it returns None; inside, the tape's Python state is read by `_replay`, never
        compiled (`lumina.model.compile`)."""
        if self.tape is None:
            return None
        return self._replay(router, routing)

    @torch.compiler.disable
    def _replay(self, router: Router, routing: Routing) -> Routing:
        ids = self.tape.take(routing.topk_ids)
        weights = router.weigh(routing.logits.sigmoid(), ids)
        return Routing(logits=routing.logits, topk_ids=ids, topk_weights=weights)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def run_layer(layer: nn.Module, *args: Any) -> Any:
    """A decoder layer's plain call (policy none)."""
    return layer(*args)


class _RunCheckpointed:
    """A decoder layer's call under `checkpointer` while autograd records: the whole layer (full) or its FFN
    sub-block (selective, the layer's `run_ffn` seam)."""

    def __init__(self, checkpointer: Checkpointer, whole_layer: bool) -> None:
        self.checkpointer, self.whole_layer = checkpointer, whole_layer

    def __call__(self, layer: nn.Module, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return layer(*args)
        if self.whole_layer:
            return self.checkpointer(layer, *args)
        return layer(*args, run_ffn=self.checkpointer)


def apply_checkpointing(model: nn.Module, policy: str | bool) -> str:
    """Apply `policy` (none | full | selective, or a legacy bool) to a built `LuminaModel`: how its backbone
    runs each decoder layer (`Backbone.run_layer`) and how many image rows the channel head recomputes at a
    time (`MultiCodebookHead.checkpoint_rows`, CHANNEL_CHECKPOINT_ROWS under full and selective). Applying
    again replaces the previous policy. Returns the policy applied."""
    policy = checkpoint_policy(policy, "gradient_checkpointing")
    backbone = model.model
    if policy == "none":
        backbone.run_layer = run_layer
    else:
        backbone.run_layer = _RunCheckpointed(backbone.checkpointer, whole_layer=policy == "full")
    model.multi_codebook_head.checkpoint_rows = 0 if policy == "none" else CHANNEL_CHECKPOINT_ROWS
    return policy
