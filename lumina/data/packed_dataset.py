"""The packed dataset: a map-style dataset keyed by `PackKey` that yields one collated `PackedBatch` per key,
and the sampler that hands this rank's keys to a DataLoader (`batch_size=None`, so a key is one batch).

A key carries the epoch and the pack's sample indices and lengths, so workers need no plan or epoch state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from torch.utils.data import Dataset, Sampler

from lumina.contract.batch import PackedBatch
from lumina.data.epoch_plan import EpochPlan, PackSchedule
from lumina.data.packing import collate_pack
from lumina.data.sources import LayoutSource, MixtureSource, PackSource

__all__ = ["FixedSampler", "LayoutSource", "MixtureSource", "PackKey", "PackSampler", "PackSource",
           "PackedDataset", "identity", "keys_for", "pack_key"]


class PackKey(NamedTuple):
    """One pack: its epoch, sample indices and their planned lengths (empty = an all-padding pack)."""

    epoch: int
    indices: tuple[int, ...]
    lengths: tuple[int, ...]


class PackedDataset(Dataset):
    """PackKey -> PackedBatch [1, seq_len, C]: lays out the pack's samples and collates them."""

    def __init__(self, source: PackSource, seq_len: int, pad_id: int, num_codebooks: int) -> None:
        self.source, self.seq_len, self.pad_id, self.num_codebooks = source, seq_len, pad_id, num_codebooks

    def __getitem__(self, key: PackKey) -> PackedBatch:
        sequences = []
        for i, planned in zip(key.indices, key.lengths, strict=True):
            seq = self.source.sequence(i, key.epoch)
            if len(seq) != planned:
                raise ValueError(f"sample {seq.sample_id} (index {i}) laid out to {len(seq)} tokens in epoch "
                                 f"{key.epoch}, but the source's lengths({key.epoch}) said {planned}")
            sequences.append(seq)
        return collate_pack(sequences, self.seq_len, self.pad_id, self.num_codebooks)


def pack_key(plan: EpochPlan, p: int | None) -> PackKey:
    """Pack index p of an epoch plan (None = padding) -> its PackKey."""
    indices = plan.pack(p) if p is not None else ()
    return PackKey(plan.epoch, indices, tuple(plan.lengths[list(indices)].tolist()))


def keys_for(plan: EpochPlan, packs: Sequence[int | None]) -> list[PackKey]:
    """Pack indices of an epoch plan (None = padding) -> PackKeys."""
    return [pack_key(plan, p) for p in packs]


class PackSampler(Sampler[PackKey]):
    """Yields this rank's remaining PackKeys of the current epoch (`epoch_fn`, else `set_epoch`), one per
    step, from where the schedule stands at `iter()`. No `__len__`: it changes per epoch (`steps_left()`).
    """

    def __init__(self, schedule: PackSchedule, epoch_fn: Callable[[], int] | None = None) -> None:
        self.schedule, self.epoch_fn, self._epoch = schedule, epoch_fn, 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def current_epoch(self) -> int:
        return self.epoch_fn() if self.epoch_fn is not None else self._epoch

    def __iter__(self) -> Iterator[PackKey]:
        epoch = self.current_epoch()
        packs = self.schedule.begin(epoch)
        plan = self.schedule.plan(epoch)
        return (pack_key(plan, p) for p in packs)  # keys made as the loader asks: no per-sample list


class FixedSampler(Sampler[PackKey]):
    """A fixed list of keys (validation: one seeded plan dealt once)."""

    def __init__(self, keys: Sequence[PackKey]) -> None:
        self.keys = list(keys)

    def __iter__(self) -> Iterator[PackKey]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def identity(x: PackedBatch) -> PackedBatch:
    """collate_fn for `batch_size=None`: a pack is already a batch."""
    return x
