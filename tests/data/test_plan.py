"""Epoch plan, dealing to data-parallel ranks, the pack cursor and re-dealing at another world size."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from synthetic_source import SyntheticSource

from lumina.data.epoch_plan import PLAN_VERSION, PackSchedule, deal, padding_packs, plan_epoch, steps_left
from lumina.data.packed_dataset import keys_for

BASE = [5, 9, 3, 7, 12, 4, 6, 8, 2, 10, 11, 3, 5, 7, 9, 1, 6, 8, 14, 2, 3, 4, 13, 5, 6]


def make_schedule(world: int, rank: int = 0, seed: int = 7, order: str = "shuffled") -> PackSchedule:
    src = SyntheticSource(BASE, num_codebooks=2, drop_prob=0.5, drop=3)
    return PackSchedule(src.lengths, 16, seed, rank=rank, world_size=world, sample_id=src.sample_id,
                        order=order)  # type: ignore[arg-type]


def test_deal_by_hand() -> None:
    assert deal(7, 0, 0, 2) == [0, 2, 4, 6]
    assert deal(7, 0, 1, 2) == [1, 3, 5, None]
    assert padding_packs(7, 0, 2) == 1
    assert deal(7, 4, 0, 3) == [4] and deal(7, 4, 2, 3) == [6]
    assert padding_packs(7, 4, 3) == 0
    assert deal(7, 5, 1, 3) == [6] and deal(7, 5, 2, 3) == [None]
    assert padding_packs(7, 5, 3) == 1
    assert deal(10, 1, 1, 4) == [2, 6, None]
    assert padding_packs(10, 1, 4) == 3
    assert steps_left(7, 7, 4) == 0 and deal(7, 7, 3, 4) == []
    with pytest.raises(ValueError, match="rank=2"):
        deal(7, 0, 2, 2)


def test_plan_covers_every_sample_once_per_epoch() -> None:
    src = SyntheticSource(BASE, num_codebooks=2, drop_prob=0.5, drop=3)
    plans = [plan_epoch(src.lengths(e), 16, 7, e) for e in range(3)]
    for plan in plans:
        flat = [i for p in range(plan.num_packs) for i in plan.pack(p)]
        assert sorted(flat) == list(range(len(BASE)))
        for p in range(plan.num_packs):
            assert sum(plan.lengths[i] for i in plan.pack(p)) <= 16
    assert src.lengths(0) != src.lengths(1)  # the seeded "dropout" changes lengths between epochs
    assert len({tuple(plan.pack(p) for p in range(plan.num_packs)) for plan in plans}) == 3
    again = plan_epoch(src.lengths(1), 16, 7, 1)
    assert again.fingerprint() == plans[1].fingerprint()
    assert plan_epoch(src.lengths(1), 16, 8, 1).fingerprint() != plans[1].fingerprint()


def test_ranks_partition_the_epoch_with_equal_steps(caplog: pytest.LogCaptureFixture) -> None:
    world = 3
    scheds = [make_schedule(world, r) for r in range(world)]
    with caplog.at_level(logging.INFO, logger="lumina.data.epoch_plan"):
        dealt = [s.begin(0) for s in scheds]
    num_packs = scheds[0].plan().num_packs
    assert len({len(d) for d in dealt}) == 1
    real = [p for d in dealt for p in d if p is not None]
    assert sorted(real) == list(range(num_packs))
    pads = sum(p is None for d in dealt for p in d)
    assert pads == (-num_packs) % world == scheds[0].padding_packs
    if pads:
        assert f"-> {pads} all-padding packs" in caplog.text
    keys = keys_for(scheds[0].plan(), dealt[-1])
    assert all((k.indices == ()) == (p is None) for k, p in zip(keys, dealt[-1], strict=True))


def remaining_after(world_from: int, steps: int, world_to: int) -> tuple[list[list[int | None]], int, int]:
    """Consume `steps` at `world_from` ranks, save, resume at `world_to`: each new rank's packs."""
    old = [make_schedule(world_from, r) for r in range(world_from)]
    for s in old:
        s.begin(0)
        s.consumed(steps)
    states = [s.state_dict() for s in old]
    assert all(st == states[0] for st in states)  # every rank saves the same global cursor
    new = [make_schedule(world_to, r) for r in range(world_to)]
    dealt = []
    for s in new:
        s.load_state_dict(states[0])
        dealt.append(s.begin(0))
    return dealt, states[0]["cursor"], new[0].plan().num_packs


@pytest.mark.parametrize(("world_from", "world_to"), [(2, 1), (1, 2), (2, 3), (2, 2)])
def test_redeal_remaining_packs(world_from: int, world_to: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lumina.data.epoch_plan"):
        dealt, cursor, num_packs = remaining_after(world_from, 2, world_to)
    assert cursor == 2 * world_from
    real = [p for d in dealt for p in d if p is not None]
    assert sorted(real) == list(range(cursor, num_packs))  # exactly the plan's remaining packs, once each
    assert len({len(d) for d in dealt}) == 1
    assert ("re-dealing the remaining" in caplog.text) == (world_from != world_to)
    if world_from == world_to:  # same DP size: every rank continues its own uninterrupted stream
        full = [make_schedule(world_from, r).begin(0) for r in range(world_from)]
        assert dealt == [f[2:] for f in full]


def test_cursor_counts_consumed_steps_and_epochs() -> None:
    s = make_schedule(2)
    s.begin(0)
    s.consumed(3)
    assert s.cursor == 6
    assert s.begin(0) == deal(s.plan().num_packs, 6, 0, 2)  # re-iterating the epoch in progress continues
    s.consumed(100)
    assert s.cursor == s.plan().num_packs  # clamped at the end of the plan
    s.begin(1)
    assert (s.epoch, s.cursor) == (1, 0)


def test_load_state_mismatch_raises() -> None:
    s = make_schedule(1)
    s.begin(0)
    state = s.state_dict()
    with pytest.raises(ValueError, match="seed=7, but the data config has seed=8"):
        make_schedule(1, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="plan fingerprint"):
        make_schedule(1).load_state_dict({**state, "fingerprint": "0" * 16})
    with pytest.raises(ValueError, match="cursor=999"):
        make_schedule(1).load_state_dict({**state, "cursor": 999})
    with pytest.raises(ValueError, match=r"lacks \['cursor'\]"):
        make_schedule(1).load_state_dict({k: v for k, v in state.items() if k != "cursor"})
    with pytest.raises(ValueError, match="pack_order='shuffled', but the data config has data.pack_order="
                                         "'longest_first'"):
        make_schedule(1, order="longest_first").load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "pack_order"}  # saved before the option: longest first
    with pytest.raises(ValueError, match="set data.pack_order=longest_first to resume it"):
        make_schedule(1).load_state_dict(old)


def test_pack_order_changes_the_plan_not_the_samples() -> None:
    src = SyntheticSource(BASE, num_codebooks=2, drop_prob=0.5, drop=3)
    shuffled, longest = (plan_epoch(src.lengths(0), 16, 7, 0, order=o) for o in ("shuffled", "longest_first"))
    assert shuffled.fingerprint() != longest.fingerprint()
    for plan in (shuffled, longest):
        assert sorted(i for p in range(plan.num_packs) for i in plan.pack(p)) == list(range(len(BASE)))
    first = longest.packing.pack(0)  # longest first: the first pack opens with the longest sample
    assert longest.lengths[first[0]] == max(longest.lengths)


def test_resume_from_another_plan_version_names_it() -> None:
    """A state saved before the counter-based CFG coins (no plan_version) or by another version stops."""
    s = make_schedule(1)
    s.begin(0)
    state = s.state_dict()
    assert state["plan_version"] == PLAN_VERSION
    old = {k: v for k, v in state.items() if k != "plan_version"}
    with pytest.raises(ValueError, match=f"plan_version=1, this lumina plans with plan_version={PLAN_VERSION}"):
        make_schedule(1).load_state_dict(old)
    with pytest.raises(ValueError, match=r"plan_version=99\b"):
        make_schedule(1).load_state_dict({**state, "plan_version": 99})
    make_schedule(1).load_state_dict(state)  # the same version resumes


def test_plan_is_flat_arrays_and_fingerprint_sees_every_pack() -> None:
    lengths = np.random.default_rng(0).integers(1, 17, 500)
    plan = plan_epoch(lengths, 16, 7, 0)
    assert isinstance(plan.packing.members, np.ndarray) and isinstance(plan.order, np.ndarray)
    members = plan.packing.members.copy()
    p = int(np.flatnonzero(np.diff(plan.packing.offsets) >= 2)[0])
    a, b = plan.packing.offsets[p], plan.packing.offsets[p + 1] - 1  # swap the ends of one pack: same samples
    members[[a, b]] = members[[b, a]]
    assert members[a] != members[b]
    other = dataclasses.replace(plan, packing=dataclasses.replace(plan.packing, members=members))
    assert other.fingerprint() != plan.fingerprint()
    swapped = plan.order.copy()
    swapped[[0, -1]] = swapped[[-1, 0]]
    assert dataclasses.replace(plan, order=swapped).fingerprint() != plan.fingerprint()
