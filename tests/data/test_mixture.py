"""Mixture plans: realised proportions near the weights, deterministic per seed, new draw per epoch."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from sample_helpers import mix_items

from lumina.data.mixture import MixturePlan, _seed


class Sized:
    """A stand-in source: only len and stored lengths matter to the plan (row i has lengths [i, i+1, i+2, i+3])."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def laid_out_lengths(self) -> np.ndarray:
        return np.arange(self.n)[:, None] + np.arange(4)[None, :]


SOURCES = {"a": Sized(1000), "b": Sized(37), "c": Sized(5)}
WEIGHTS = {"a": 5.0, "b": 3.0, "c": 2.0}  # normalised 0.5 / 0.3 / 0.2
N = 20_000


def test_realised_proportions_match_the_weights():
    """Each slot is an independent categorical draw, so a source's share has std sqrt(p(1-p)/N) <= 0.0036
    for N = 20000; 0.02 is > 5 std (a false failure has probability < 1e-6 per source and epoch)."""
    plan = MixturePlan(SOURCES, WEIGHTS, seed=1, samples_per_epoch=N)
    for epoch in range(3):
        mix = plan.epoch(epoch)
        assert len(mix_items(mix)) == N and sum(mix.counts.values()) == N
        realised = Counter(name for name, _ in mix_items(mix))
        for name, w in WEIGHTS.items():
            target = w / sum(WEIGHTS.values())
            assert mix.proportions[name] == realised[name] / N
            assert abs(mix.proportions[name] - target) < 0.02, (epoch, name, mix.proportions)
        assert mix.log_dict() == {f"data/mix/{k}": v for k, v in mix.proportions.items()}


def test_deterministic_per_seed_and_different_per_epoch():
    plan = MixturePlan(SOURCES, WEIGHTS, seed=7, samples_per_epoch=500)
    again = MixturePlan(SOURCES, WEIGHTS, seed=7, samples_per_epoch=500)
    assert mix_items(plan.epoch(2)) == mix_items(again.epoch(2))
    assert mix_items(plan.epoch(2)) != mix_items(plan.epoch(3))
    other_seed = MixturePlan(SOURCES, WEIGHTS, seed=8, samples_per_epoch=500)
    assert mix_items(plan.epoch(2)) != mix_items(other_seed.epoch(2))


def test_indices_cover_a_source_before_repeating():
    """Indices come from whole permutations, so with `count` draws from a source of size n every index
    appears floor(count / n) or ceil(count / n) times (e.g. 'c': ~4000 draws of 5 samples)."""
    mix = MixturePlan(SOURCES, WEIGHTS, seed=3, samples_per_epoch=N).epoch(0)
    for name, source in SOURCES.items():
        seen = Counter(i for n, i in mix_items(mix) if n == name)
        count = mix.counts[name]
        assert set(seen) <= set(range(len(source)))
        lo, hi = count // len(source), math.ceil(count / len(source))
        assert all(lo <= seen.get(i, 0) <= hi for i in range(len(source))), name


def slot_by_slot(plan: MixturePlan, epoch: int) -> list[tuple[str, int]]:
    """The draw as the rule reads, one slot at a time in Python: a categorical source per slot, then each
    source's next index from its cycled per-epoch permutations (the lists the plan built before it held arrays,
    so checkpoints of either see the same packs)."""
    gen = torch.Generator().manual_seed(_seed("mixture", plan.seed, epoch))
    probs = torch.tensor([plan.weights[n] for n in plan.names], dtype=torch.float64)
    choice = torch.multinomial(probs, plan.samples_per_epoch, replacement=True, generator=gen).tolist()
    perms: dict[str, list[int]] = {}
    for name in plan.names:
        source_gen = torch.Generator().manual_seed(_seed("mixture-index", plan.seed, epoch, name))
        while len(perms.setdefault(name, [])) < choice.count(plan.names.index(name)):
            perms[name] += torch.randperm(len(plan.sources[name]), generator=source_gen).tolist()
    taken = Counter()
    items = []
    for k in choice:
        name = plan.names[k]
        items.append((name, perms[name][taken[name]]))
        taken[name] += 1
    return items


@pytest.mark.parametrize("seed", range(4))
def test_the_arrays_hold_the_slot_by_slot_draw(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 60, size=int(rng.integers(1, 5)))
    sources = {f"s{i}": Sized(int(n)) for i, n in enumerate(sizes)}
    weights = {name: float(w) for name, w in zip(sources, rng.random(len(sources)) + 0.05, strict=True)}
    plan = MixturePlan(sources, weights, seed=seed, samples_per_epoch=int(rng.integers(1, 400)))
    for epoch in range(2):
        mix = plan.epoch(epoch)
        want = slot_by_slot(plan, epoch)
        assert mix_items(mix) == want and [mix.item(j) for j in range(len(want))] == want
        assert plan.lengths(mix).tolist() == [[i, i + 1, i + 2, i + 3] for _, i in want]


def test_lengths_come_from_the_stored_columns():
    plan = MixturePlan(SOURCES, WEIGHTS, seed=0, samples_per_epoch=50)
    mix = plan.epoch(0)
    lengths = plan.lengths(mix)
    assert lengths.shape == (50, 4)
    for (_, index), row in zip(mix_items(mix), lengths, strict=True):
        assert row.tolist() == [index, index + 1, index + 2, index + 3]


def test_zero_weight_source_is_never_drawn():
    mix = MixturePlan(SOURCES, {"a": 1.0, "b": 0.0, "c": 1.0}, seed=0, samples_per_epoch=300).epoch(0)
    assert mix.counts["b"] == 0 and mix.proportions["b"] == 0.0
    assert {name for name, _ in mix_items(mix)} == {"a", "c"}


def test_an_empty_zero_weight_source_gets_no_slots():
    plan = MixturePlan({"a": Sized(4), "e": Sized(0)}, {"a": 1.0, "e": 0.0}, seed=0, samples_per_epoch=6)
    mix = plan.epoch(0)
    assert mix.counts == {"a": 6, "e": 0} and sorted(plan.lengths(mix)[:, 0].tolist()) == sorted(
        i for _, i in mix_items(mix))


@pytest.mark.parametrize(("weights", "spe", "pattern"), [
    ({"a": 1.0, "b": 1.0}, 10, "differ from sources names"),
    ({"a": 1.0, "b": -1.0, "c": 1.0}, 10, r"weights\['b'\]=-1.0"),
    ({"a": 0.0, "b": 0.0, "c": 0.0}, 10, "positive sum"),
    ({"a": 1.0, "b": float("nan"), "c": 1.0}, 10, r"weights\['b'\]=nan"),
    (WEIGHTS, 0, "samples_per_epoch=0"),
])
def test_bad_configs_raise(weights, spe, pattern):
    with pytest.raises(ValueError, match=pattern):
        MixturePlan(SOURCES, weights, seed=0, samples_per_epoch=spe)


def test_empty_source_with_weight_raises():
    with pytest.raises(ValueError, match=r"sources\['e'\] is empty"):
        MixturePlan({"a": Sized(3), "e": Sized(0)}, {"a": 1.0, "e": 1.0}, seed=0, samples_per_epoch=10)


def test_concatenation_addresses_every_source(tokens):
    from sample_helpers import mixed_samples

    from lumina.contract.schema import Sample
    from lumina.data.mixture import ConcatSampleDataset
    from lumina.data.storage import InMemorySampleDataset

    def length(sample: Sample, drop_text: bool, drop_image: bool) -> int:
        return len(sample.id)

    def renamed(prefix: str) -> list[Sample]:
        return [Sample(f"{prefix}-{s.id}", s.turns, s.source) for s in mixed_samples()]

    sources = {"x": InMemorySampleDataset(renamed("x"), tokens, length),
               "yy": InMemorySampleDataset(renamed("yy")[:2], tokens, length)}
    plan = MixturePlan(sources, {"x": 1.0, "yy": 1.0}, seed=0, samples_per_epoch=40)
    mix = plan.epoch(0)
    concat = ConcatSampleDataset(sources)
    assert len(concat) == 5 and concat.sample_ids()[3:] == ["yy-und-0", "yy-t2i-0"]
    assert concat.laid_out_lengths()[:, 0].tolist() == [7, 7, 8, 8, 8]
    for name, index in mix_items(mix):
        flat = {"x": 0, "yy": 3}[name] + index  # sources in order: x holds 3 samples
        assert concat.locate(flat) == (name, index)
        assert concat[flat].id == sources[name][index].id
    with pytest.raises(ValueError, match="codebook_size: found 64, expected 4096"):
        ConcatSampleDataset({"a": sources["x"], "b": InMemorySampleDataset(
            mixed_samples(c=8, high=64), tokens.replace(codebook_size=64), length)})
