"""The epoch plan (which samples form which pack, in which order), dealing packs to data-parallel ranks,
and the global pack cursor that makes a resume exact.

Plan of epoch e: best fit over that epoch's laid-out lengths (placement order, or longest-first ties, drawn
by an RNG seeded by (seed, e)), then the pack order shuffled by a second RNG seeded by (seed, e). Every rank
computes the same plan from the lengths it holds, so only (epoch, cursor) is saved, with `PLAN_VERSION`: a
resume under another version stops instead of training other packs.

Dealing: the cursor counts packs handed out (all ranks). At each step rank r of W trains pack `cursor + r`
and the cursor moves by W; a slot past the end gets an all-padding pack, so every rank runs the same number
of steps. A resume at another W deals `plan[cursor:]` round-robin over the new W.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lumina.data.packing import OverlongPolicy, Packing, PackOrder, best_fit

log = logging.getLogger(__name__)


PLAN_VERSION = 2  # 1: CFG-dropout coins from one torch.Generator per sample; 2: counter-based coins (noise.py)


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """Pack p of the epoch is `packing`'s pack order[p] (int64 [num_packs]); lengths [N]: this epoch's."""

    epoch: int
    packing: Packing
    order: np.ndarray
    lengths: np.ndarray

    @property
    def num_packs(self) -> int:
        return len(self.order)

    def pack(self, p: int) -> tuple[int, ...]:
        """Sample indices of the p-th pack of the epoch."""
        return self.packing.pack(int(self.order[p]))

    def fingerprint(self) -> str:
        """A short digest of the plan (pack contents and order) to check a resume sees the same plan."""
        return self._digest

    @cached_property
    def _digest(self) -> str:
        h = hashlib.blake2b(digest_size=8)
        h.update(f"v{PLAN_VERSION}:{self.epoch}:{self.packing.seq_len}:{len(self.lengths)}".encode())
        for array in (self.order, self.packing.offsets, self.packing.members):
            h.update(np.ascontiguousarray(array).data)
        return h.hexdigest()


def plan_epoch(lengths: np.ndarray | Sequence[int], seq_len: int, seed: int, epoch: int,
               overlong: OverlongPolicy = "error", sample_id: Callable[[int], str] | None = None,
               order: PackOrder = "shuffled") -> EpochPlan:
    """The plan of `epoch` from that epoch's laid-out lengths (after its seeded CFG dropout)."""
    lengths = np.asarray(lengths)
    packing = best_fit(lengths, seq_len, np.random.default_rng([seed, epoch, 0]), order, overlong, sample_id)
    pack_order = np.random.default_rng([seed, epoch, 1]).permutation(packing.num_packs)
    return EpochPlan(epoch, packing, pack_order, lengths)


def steps_left(num_packs: int, cursor: int, world_size: int) -> int:
    """Steps every rank still runs when the packs from `cursor` on are dealt over `world_size` ranks."""
    _check_world(0, world_size)
    return math.ceil(max(num_packs - cursor, 0) / world_size)


def deal(num_packs: int, cursor: int, rank: int, world_size: int) -> list[int | None]:
    """Pack indices rank `rank` trains from `cursor` on, one per step; None = an all-padding pack."""
    _check_world(rank, world_size)
    steps = steps_left(num_packs, cursor, world_size)
    return [p if (p := cursor + s * world_size + rank) < num_packs else None for s in range(steps)]


def padding_packs(num_packs: int, cursor: int, world_size: int) -> int:
    """All-padding packs (all ranks together) in a deal of the packs from `cursor` on."""
    return steps_left(num_packs, cursor, world_size) * world_size - max(num_packs - cursor, 0)


def _check_world(rank: int, world_size: int) -> None:
    if world_size <= 0:
        raise ValueError(f"world_size={world_size}: must be positive")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}: must lie in [0, world_size={world_size})")


class PackSchedule:
    """One rank's position in the training stream: `begin(epoch)` returns this rank's remaining packs,
    `consumed()` counts finished steps, the state dict carries (epoch, cursor) across a restart."""

    def __init__(self, lengths: Callable[[int], Sequence[int]], seq_len: int, seed: int,
                 overlong: OverlongPolicy = "error", sample_id: Callable[[int], str] | None = None,
                 rank: int = 0, world_size: int = 1, order: PackOrder = "shuffled") -> None:
        _check_world(rank, world_size)
        self.lengths_fn, self.seq_len, self.seed, self.order = lengths, seq_len, seed, order
        self.overlong, self.sample_id = overlong, sample_id
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start_cursor = 0  # where this epoch's (re)started iteration began dealing
        self.steps = 0  # steps consumed since start_cursor
        self._plan: EpochPlan | None = None
        self._pending: dict | None = None  # a loaded state not yet applied
        self.padding_packs = 0  # all-padding packs (all ranks) in the deal of the epoch in progress

    def set_rank(self, rank: int, world_size: int) -> None:
        _check_world(rank, world_size)
        self.rank, self.world_size = rank, world_size

    def plan(self, epoch: int | None = None) -> EpochPlan:
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = plan_epoch(self.lengths_fn(epoch), self.seq_len, self.seed, epoch, self.overlong,
                                    self.sample_id, self.order)
            plan = self._plan
            log.info("epoch %d: %d samples -> %d packs of %d tokens, fill ratio %.4f", epoch, len(plan.lengths),
                     plan.num_packs, self.seq_len, plan.packing.fill_ratio)
            if plan.packing.skipped.size:
                log.warning("epoch %d: skipped %d samples longer than seq_len=%d", epoch,
                            len(plan.packing.skipped), self.seq_len)
        return self._plan

    @property
    def cursor(self) -> int:
        """Global pack cursor: packs of this epoch's plan handed out to finished steps (all ranks)."""
        return min(self.start_cursor + self.steps * self.world_size, self.plan().num_packs)

    def begin(self, epoch: int) -> list[int | None]:
        """This rank's remaining packs of `epoch`, one per step, from a loaded state's cursor, where the epoch
        in progress stands, or 0."""
        if self._pending is not None and self._pending["epoch"] == epoch:
            self._apply(self._pending)
            if int(self._pending["world_size"]) != self.world_size:
                log.warning("resuming epoch %d at cursor %d/%d with data-parallel size %d (saved at %d): "
                            "re-dealing the remaining %d packs", epoch, self.start_cursor, self.plan().num_packs,
                            self.world_size, self._pending["world_size"], self.plan().num_packs - self.start_cursor)
        elif epoch != self.epoch:
            self.epoch, self.start_cursor, self.steps = epoch, 0, 0
        else:
            self.start_cursor, self.steps = self.cursor, 0
        self._pending = None
        plan = self.plan()
        pad = self.padding_packs = padding_packs(plan.num_packs, self.start_cursor, self.world_size)
        if pad:
            log.info("epoch %d: %d packs over %d ranks from cursor %d -> %d all-padding packs", epoch,
                     plan.num_packs - self.start_cursor, self.world_size, self.start_cursor, pad)
        return deal(plan.num_packs, self.start_cursor, self.rank, self.world_size)

    def consumed(self, steps: int = 1) -> None:
        self.steps += steps

    def state_dict(self) -> dict:
        plan = self.plan()
        return {"epoch": self.epoch, "cursor": self.cursor, "world_size": self.world_size, "seed": self.seed,
                "seq_len": self.seq_len, "pack_order": self.order, "num_packs": plan.num_packs,
                "fingerprint": plan.fingerprint(), "plan_version": PLAN_VERSION}

    def load_state_dict(self, state: dict) -> None:
        """Resume at (epoch, cursor); applied now, and again by `begin(epoch)` if the trainer re-enters it."""
        missing = {"epoch", "cursor", "world_size", "seed", "seq_len", "fingerprint"} - set(state)
        if missing:
            raise ValueError(f"pack schedule state lacks {sorted(missing)}; got keys {sorted(state)}")
        saved_version = state.get("plan_version", 1)  # states saved before versioning: version 1
        if saved_version != PLAN_VERSION:
            raise ValueError(f"resume state was planned with plan_version={saved_version}, this lumina plans with "
                             f"plan_version={PLAN_VERSION} (other CFG-dropout coins, so other packs); resume it with "
                             "the lumina that saved it, or start the run afresh")
        for key in ("seed", "seq_len"):
            if state[key] != getattr(self, key):
                raise ValueError(f"resume state has {key}={state[key]}, but the data config has "
                                 f"{key}={getattr(self, key)}")
        saved_order = state.get("pack_order", "longest_first")  # states saved before the option existed
        if saved_order != self.order:
            raise ValueError(f"resume state was packed with pack_order={saved_order!r}, but the data config has "
                             f"data.pack_order={self.order!r}; set data.pack_order={saved_order} to resume it")
        self._apply(state)
        self._pending = dict(state)

    def _apply(self, state: dict) -> None:
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        plan = self.plan(epoch)
        if state["fingerprint"] != plan.fingerprint():
            raise ValueError(f"resume state for epoch {epoch} has plan fingerprint {state['fingerprint']}, "
                             f"but this data gives {plan.fingerprint()} (different source, lengths or seed)")
        if not 0 <= cursor <= plan.num_packs:
            raise ValueError(f"resume state cursor={cursor} outside [0, {plan.num_packs}] for epoch {epoch}")
        self.epoch, self.start_cursor, self.steps = epoch, cursor, 0
