"""Pack sources: what packing reads from a data set (per-epoch laid-out lengths, laid-out sequences)."""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import numpy as np

from lumina.contract.training_sequence import TrainingSequence
from lumina.data.mixture import ConcatSampleDataset, EpochMix, MixturePlan
from lumina.data.noise import NoiseConfig, dropout_lengths
from lumina.data.sequence_layout import layout_eval, layout_sample
from lumina.data.storage import SampleDataset

log = logging.getLogger(__name__)


@runtime_checkable
class PackSource(Protocol):
    """A picklable data source: per-epoch laid-out lengths [N] (after CFG dropout) and sequences."""

    def __len__(self) -> int: ...

    def lengths(self, epoch: int) -> np.ndarray: ...

    def sequence(self, index: int, epoch: int) -> TrainingSequence: ...

    def sample_id(self, index: int) -> str: ...


class LayoutSource:
    """A `PackSource` over a `SampleDataset`: stored lengths picked by the epoch's CFG dropout, sequences from
    `layout_sample`; with `eval_t`, a validation source (`layout_eval` at noise level eval_t, no dropout)."""

    def __init__(self, dataset: SampleDataset, noise: NoiseConfig, seed: int, eval_t: float | None = None) -> None:
        if eval_t is not None and not 0.0 <= eval_t <= 1.0:
            raise ValueError(f"eval_t={eval_t}: must lie in [0, 1]")
        self.dataset, self.noise, self.seed, self.eval_t = dataset, noise, seed, eval_t
        self._hashes = dataset.id_hashes()
        self._variants = np.asarray(dataset.laid_out_lengths())  # [N, 4] keep/dt/di/both
        if self._variants.shape != (len(self._hashes), 4):
            raise ValueError(f"laid_out_lengths() has shape {list(self._variants.shape)}, "
                             f"expected [{len(self._hashes)}, 4]")

    def __len__(self) -> int:
        return len(self._hashes)

    def sample_id(self, index: int) -> str:
        return self.dataset.sample_id(index)

    def lengths(self, epoch: int) -> np.ndarray:
        if self.eval_t is not None:
            return self._variants[:, 0].astype(np.int32)
        return dropout_lengths(self._variants, self._hashes, self.noise, self.seed, epoch)

    def sequence(self, index: int, epoch: int) -> TrainingSequence:
        sample = self.dataset[index]
        if self.eval_t is not None:
            return layout_eval(sample, self.dataset.tokens, self.noise, self.seed, self.eval_t)
        return layout_sample(sample, self.dataset.tokens, self.noise, self.seed, epoch)


class MixtureSource:
    """A `PackSource` over a `MixturePlan` (sources sharing one SpecialTokens): slot j of epoch e is the
    mixture's j-th item of that epoch, laid out by `layout_sample`."""

    def __init__(self, mixture: MixturePlan, noise: NoiseConfig, seed: int) -> None:
        self.mixture, self.noise, self.seed = mixture, noise, seed
        self.tokens = ConcatSampleDataset(mixture.sources).tokens  # checks the sources agree
        self._hashes = {name: mixture.sources[name].id_hashes() for name in mixture.names}
        self._mix: EpochMix | None = None

    def mix(self, epoch: int) -> EpochMix:
        """The mixture's draw for `epoch` (cached); `.proportions` are the realised shares to log."""
        if self._mix is None or self._mix.epoch != epoch:
            self._mix = self.mixture.epoch(epoch)
            shares = ", ".join(f"{n} {p:.4f} (weight {self.mixture.weights[n]:.4f})"
                               for n, p in self._mix.proportions.items())
            log.info("epoch %d mixture of %d samples, realised proportions: %s", epoch,
                     self.mixture.samples_per_epoch, shares)
        return self._mix

    def __len__(self) -> int:
        return self.mixture.samples_per_epoch

    def sample_id(self, index: int) -> str:
        """Id of slot `index` in the most recently drawn epoch."""
        name, i = (self._mix or self.mix(0)).item(index)
        return self.mixture.sources[name].sample_id(i)

    def lengths(self, epoch: int) -> np.ndarray:
        mix = self.mix(epoch)
        hashes = self.mixture.gather(mix, self._hashes)
        return dropout_lengths(self.mixture.lengths(mix), hashes, self.noise, self.seed, epoch)

    def sequence(self, index: int, epoch: int) -> TrainingSequence:
        sample = self.mixture.sample(self.mix(epoch).item(index))
        return layout_sample(sample, self.tokens, self.noise, self.seed, epoch)
