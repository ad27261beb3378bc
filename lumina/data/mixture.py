"""Data mixtures: named sources with weights; each epoch draws a seeded mix and reports its realised shares.

    plan = MixturePlan({"world": world_ds, "web": shard_ds}, {"world": 0.3, "web": 0.7}, seed=0,
                       samples_per_epoch=10_000)
    mix = plan.epoch(3)          # EpochMix: per slot its source (mix.source, into plan.names) and index
    mix.proportions              # e.g. {"world": 0.2987, "web": 0.7013}: log these
    plan.lengths(mix)            # [n, 4] stored laid-out lengths of the drawn items (no payload decoding)

Each slot's source is a categorical draw with the normalised weights; a source's slots take a fresh permutation
per epoch (cycled: every sample before any repeat). A pure function of (seed, epoch), in NumPy arrays.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numba
import numpy as np
import torch

from lumina.contract.schema import Sample
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.storage import SampleDataset, checked_index, settings_mismatch


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


@numba.njit(cache=True, nogil=True)
def _gather_rows(source: np.ndarray, index: np.ndarray, k: int, table: np.ndarray, out: np.ndarray) -> None:
    """out[j] = table[index[j]] for every slot j with source[j] == k (table, out: 2-D, rows)."""
    for j in range(source.size):
        if source[j] == k:
            row = index[j]
            for c in range(table.shape[1]):
                out[j, c] = table[row, c]


@dataclass(frozen=True)
class EpochMix:
    """One epoch's draw: slot j holds sample `index[j]` of source `names[source[j]]`."""

    epoch: int
    names: tuple[str, ...]
    source: np.ndarray  # [n] uint8 / uint16 position in names
    index: np.ndarray  # [n] int64 index within that source
    counts: dict[str, int]
    proportions: dict[str, float]

    def item(self, slot: int) -> tuple[str, int]:
        """(source name, index) of one slot."""
        return self.names[int(self.source[slot])], int(self.index[slot])

    def log_dict(self, prefix: str = "data/mix/") -> dict[str, float]:
        """Realised proportions keyed for a logger."""
        return {f"{prefix}{name}": p for name, p in self.proportions.items()}


class MixturePlan:
    """sources: name -> dataset; weights: name -> weight >= 0 (normalised), one per source."""

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
        """The draw of `epoch`, deterministic in (seed, epoch)."""
        gen = torch.Generator().manual_seed(_seed("mixture", self.seed, epoch))
        probs = torch.tensor([self.weights[n] for n in self.names], dtype=torch.float64)
        choice = torch.multinomial(probs, self.samples_per_epoch, replacement=True, generator=gen).numpy()
        source = choice.astype(np.min_scalar_type(len(self.names) - 1))
        counts = np.bincount(source, minlength=len(self.names)).tolist()
        mix = EpochMix(epoch, tuple(self.names), source, np.empty(self.samples_per_epoch, np.int64),
                       dict(zip(self.names, counts, strict=True)),
                       {name: c / self.samples_per_epoch for name, c in zip(self.names, counts, strict=True)})
        for k, (name, count) in enumerate(zip(self.names, counts, strict=True)):
            if count:
                size = len(self.sources[name])
                source_gen = torch.Generator().manual_seed(_seed("mixture-index", self.seed, epoch, name))
                rounds = [torch.randperm(size, generator=source_gen) for _ in range(math.ceil(count / size))]
                mix.index[source == k] = torch.cat(rounds)[:count].numpy()  # to the source's slots, in order
        return mix

    def gather(self, mix: EpochMix, tables: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per-source tables (name -> [len(source), ...]) -> [n, ...] rows of the drawn items, slot order."""
        arrays = [np.asarray(tables[name]) for name in self.names]
        dtype = np.result_type(*arrays)
        out = np.empty((len(mix.index), *arrays[0].shape[1:]), dtype)
        for k, (name, array) in enumerate(zip(self.names, arrays, strict=True)):
            if mix.counts[name]:  # (an empty source has weight 0 and no slots)
                rows = np.ascontiguousarray(array, dtype=dtype).reshape(len(array), -1)
                _gather_rows(mix.source, mix.index, k, rows, out.reshape(len(out), -1))
        return out

    def sample(self, item: tuple[str, int]) -> Sample:
        """The sample of one (source name, index) item (`EpochMix.item`)."""
        name, index = item
        return self.sources[name][index]

    def lengths(self, mix: EpochMix) -> np.ndarray:
        """[n, 4] stored laid-out lengths of the items, in the stored tables' type."""
        return self.gather(mix, {name: self.sources[name].laid_out_lengths() for name in self.names})


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
        index = checked_index(index, len(self))
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
