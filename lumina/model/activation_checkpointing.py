"""Activation checkpointing (`LuminaConfig.gradient_checkpointing`), applied to a built model from outside its
code by `apply_checkpointing` (as torchtitan's apply_ac), with every router's top-k replayed on recompute.

A recompute could select other experts than the forward did (another kernel, bf16 reductions, a changed
expert bias). So the forward records each router's top-k ids on a `RoutingTape`, the recompute replays them,
and both recompute the weights at those ids (`MoERouter.weigh`): gradients equal the `none` policy's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from lumina.model.config import checkpoint_policy
from lumina.model.routers import MoERouter, Routing

CHANNEL_CHECKPOINT_ROWS = 128  # image rows per checkpointed chunk of the channel head (policies full, selective)


class RoutingTape:
    """The top-k ids [T, k] of the routers one checkpointed call ran, in call order."""

    def __init__(self) -> None:
        self.ids: list[torch.Tensor] = []
        self.cursor: int | None = None  # None while recording; else the next entry to replay

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
            self.tape.cursor = 0  # each recompute replays the whole tape
        self.previous, self.owner.tape = self.owner.tape, self.tape

    def __exit__(self, *exc: object) -> None:
        self.owner.tape = self.previous


class Checkpointer:
    """`checkpointer(fn, *args)` = `fn(*args)` under non-reentrant checkpointing, the routers' top-k replayed."""

    def __init__(self, routers: Iterable[MoERouter]) -> None:
        self.tape: RoutingTape | None = None
        self.handles: list[RemovableHandle] = [r.register_forward_hook(self._route) for r in routers]

    @torch.compiler.disable
    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        return checkpoint(fn, *args, use_reentrant=False, context_fn=self._contexts)

    def _contexts(self) -> tuple[_TapeContext, _TapeContext]:
        """(forward context, recompute context) of one checkpointed call, sharing one fresh tape."""
        tape = RoutingTape()
        return _TapeContext(self, tape, replay=False), _TapeContext(self, tape, replay=True)

    @property
    def active(self) -> bool:
        """True inside a checkpointed call: this checkpointer's hook then weighs whatever ids reach it."""
        return self.tape is not None

    def _route(self, router: MoERouter, args: object, routing: Routing) -> Routing | None:
        """Router forward hook: None outside a checkpointed call; inside, `_replay` (never compiled)."""
        if self.tape is None:
            return None
        return self._replay(router, routing)

    @torch.compiler.disable
    def _replay(self, router: MoERouter, routing: Routing) -> Routing:
        ids = self.tape.take(routing.topk_ids)
        weights = router.weigh(routing.logits, ids)
        return Routing(logits=routing.logits, topk_ids=ids, topk_weights=weights)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class Checkpointed:
    """A method `apply_checkpointing` replaced: while autograd records, `fn` under `checkpointer`, in chunks of
    `rows` independent rows along dim 0 of every argument when rows > 0; otherwise the plain call."""

    def __init__(self, fn: Callable[..., Any], checkpointer: Checkpointer, rows: int = 0) -> None:
        self.fn, self.checkpointer, self.rows = fn, checkpointer, rows

    def __call__(self, *args: Any) -> Any:
        if not torch.is_grad_enabled() or (self.rows > 0 and args[0].shape[0] == 0):
            return self.fn(*args)
        if self.rows <= 0:
            return self.checkpointer(self.fn, *args)
        return torch.cat([self.checkpointer(self.fn, *(a[i:i + self.rows] for a in args))
                          for i in range(0, args[0].shape[0], self.rows)])


def checkpointer_of(model: nn.Module) -> Checkpointer | None:
    """The `Checkpointer` `apply_checkpointing` put on `model`'s layers, or None (policy none)."""
    for layer in model.model.layers:
        for name in ("forward", "ffn"):
            wrapped = vars(layer).get(name)
            if isinstance(wrapped, Checkpointed):
                return wrapped.checkpointer
    return None


def apply_checkpointing(model: nn.Module, policy: str | bool) -> str:
    """Apply `policy` (none | full | selective, or a legacy bool) to a built `LuminaModel` from outside its
    code, by replacing methods on the module instances (names and state-dict keys stay as they are):
      full       each decoder layer's `forward`;
      selective  each decoder layer's `ffn` (post-attention RMSNorm + FFN / MoE sub-block);
      both       the image head's `run` (`ImageHead.run`), CHANNEL_CHECKPOINT_ROWS image rows at a time.
    One `Checkpointer` on the model's routers replays their top-k on recompute. Applying again replaces the
    previous policy. Returns the policy applied."""
    policy = checkpoint_policy(policy, "gradient_checkpointing")
    layers, head = model.model.layers, model.image_head
    for module, name in [(layer, name) for layer in layers for name in ("forward", "ffn")] + [(head, "run")]:
        previous = vars(module).pop(name, None)  # back to the class's method
        if isinstance(previous, Checkpointed):
            previous.checkpointer.remove()
    if policy == "none":
        return policy
    checkpointer = Checkpointer(m for m in layers.modules() if isinstance(m, MoERouter))
    name = "forward" if policy == "full" else "ffn"
    for layer in layers:
        setattr(layer, name, Checkpointed(getattr(layer, name), checkpointer))
    head.run = Checkpointed(head.run, checkpointer, rows=CHANNEL_CHECKPOINT_ROWS)
    return policy
