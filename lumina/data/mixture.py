"""Data mixtures: named sources with weights; each epoch draws a seeded mix and reports its realised shares.

    plan = MixturePlan({"world": world_ds, "web": shard_ds}, {"world": 0.3, "web": 0.7}, seed=0,
                       samples_per_epoch=10_000)
    mix = plan.epoch(3)          # EpochMix: items [(source, index)], counts, realised proportions
    mix.proportions              # e.g. {"world": 0.2987, "web": 0.7013}: log these
    plan.lengths(mix)            # [n, 4] stored laid-out lengths of the drawn items (no payload decoding)
    plan.flat_indices(mix)       # the same items as indices into `ConcatSampleDataset(plan.sources)`

Each slot's source is an independent categorical draw with the normalised weights (so realised shares
fluctuate around the weights with binomial noise, std sqrt(p (1 - p) / n)); within a source, indices are
taken from a fresh permutation per epoch, cycled when the source is drawn more often than it has samples
(so every sample of a source appears before any repeats). Everything is a pure function of (seed, epoch).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lumina.data.schema import Sample
from lumina.data.special_tokens import SpecialTokens
from lumina.data.storage import SampleDataset, settings_mismatch


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class EpochMix:
    epoch: int
    items: list[tuple[str, int]]
    counts: dict[str, int]
    proportions: dict[str, float]

    def log_dict(self, prefix: str = "data/mix/") -> dict[str, float]:
        """Realised proportions keyed for a logger."""
        return {f"{prefix}{name}": p for name, p in self.proportions.items()}


class MixturePlan:
    """sources: name -> dataset (anything with len; `__getitem__` and `laid_out_lengths` for `sample`/`lengths`);
    weights: name -> weight >= 0 (normalised; every source needs one); samples_per_epoch: slots per epoch."""

    def __init__(self, sources: Mapping[str, SampleDataset], weights: Mapping[str, float], seed: int,
                 samples_per_epoch: int):
        if not sources:
            raise ValueError("sources is empty")
        if set(weights) != set(sources):
            raise ValueError(f"weights names {sorted(weights)} differ from sources names {sorted(sources)}")
        for name, w in weights.items():
            if not isinstance(w, int | float) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
                raise ValueError(f"weights[{name!r}]={w!r}: must be a finite number >= 0")
            if w > 0 and len(sources[name]) == 0:
                raise ValueError(f"sources[{name!r}] is empty but has weight {w}")
        total = sum(weights.values())
        if total <= 0:
            raise ValueError(f"weights={dict(weights)}: need a positive sum")
        if not isinstance(samples_per_epoch, int) or samples_per_epoch <= 0:
            raise ValueError(f"samples_per_epoch={samples_per_epoch!r}: must be a positive integer")
        self.names = list(sources)
        self.sources = dict(sources)
        self.weights = {name: float(weights[name]) / total for name in self.names}
        self.seed = seed
        self.samples_per_epoch = samples_per_epoch

    def epoch(self, epoch: int) -> EpochMix:
        """The (source, index) list of `epoch`, deterministic in (seed, epoch)."""
        gen = torch.Generator().manual_seed(_seed("mixture", self.seed, epoch))
        probs = torch.tensor([self.weights[n] for n in self.names], dtype=torch.float64)
        choice = torch.multinomial(probs, self.samples_per_epoch, replacement=True, generator=gen)
        counts = torch.bincount(choice, minlength=len(self.names)).tolist()
        picks: list[list[int]] = []
        for name, count in zip(self.names, counts, strict=True):
            size = len(self.sources[name])
            source_gen = torch.Generator().manual_seed(_seed("mixture-index", self.seed, epoch, name))
            rounds = [torch.randperm(size, generator=source_gen) for _ in range(math.ceil(count / size))] if count else []
            picks.append(torch.cat(rounds)[:count].tolist() if rounds else [])
        cursor = [0] * len(self.names)
        items = []
        for k in choice.tolist():
            items.append((self.names[k], picks[k][cursor[k]]))
            cursor[k] += 1
        n = self.samples_per_epoch
        return EpochMix(epoch, items, dict(zip(self.names, counts, strict=True)),
                        {name: c / n for name, c in zip(self.names, counts, strict=True)})

    def sample(self, item: tuple[str, int]) -> Sample:
        name, index = item
        return self.sources[name][index]

    def lengths(self, mix: EpochMix) -> np.ndarray:
        """[len(mix.items), 4] stored laid-out lengths (keep, drop_text, drop_image, drop_both) of the items."""
        table = {name: self.sources[name].laid_out_lengths() for name in self.names}
        if not mix.items:
            return np.zeros((0, 4), dtype=np.int64)
        return np.stack([table[name][index] for name, index in mix.items]).astype(np.int64)

    def flat_indices(self, mix: EpochMix) -> np.ndarray:
        """[len(mix.items)] int64 indices of the items in `ConcatSampleDataset(self.sources)` (sources in order)."""
        offsets = dict(zip(self.names, np.cumsum([0] + [len(self.sources[n]) for n in self.names[:-1]]), strict=True))
        return np.array([offsets[name] + index for name, index in mix.items], dtype=np.int64)


class ConcatSampleDataset:
    """Several `SampleDataset`s as one (in the given order); they must share the same SpecialTokens."""

    def __init__(self, sources: Mapping[str, SampleDataset]):
        if not sources:
            raise ValueError("sources is empty")
        self.names = list(sources)
        self.sources = dict(sources)
        first = self.names[0]
        self.tokens: SpecialTokens = self.sources[first].tokens
        for name in self.names[1:]:
            diff = settings_mismatch(self.sources[name].tokens, self.tokens)
            if diff:
                raise ValueError(f"sources[{name!r}] has other special-token settings than sources[{first!r}]: "
                                 + "; ".join(diff))
        self._starts = np.cumsum([0] + [len(self.sources[n]) for n in self.names])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate(self, index: int) -> tuple[str, int]:
        """Global index -> (source name, index in that source)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index={index} out of range for a dataset of {len(self)} samples")
        index %= len(self)
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.names[k], index - int(self._starts[k])

    def __getitem__(self, index: int) -> Sample:
        name, i = self.locate(index)
        return self.sources[name][i]

    def laid_out_lengths(self) -> np.ndarray:
        return np.concatenate([np.asarray(self.sources[n].laid_out_lengths(), dtype=np.int64).reshape(-1, 4)
                               for n in self.names])

    def id_hashes(self) -> np.ndarray:
        return np.concatenate([self.sources[n].id_hashes() for n in self.names])

    def sample_id(self, index: int) -> str:
        name, i = self.locate(index)
        return self.sources[name].sample_id(i)

    def sample_ids(self) -> list[str]:
        return [sid for n in self.names for sid in self.sources[n].sample_ids()]
