"""`SyntheticSource`: a `PackSource` of made-up sequences that carry their own identity (packing tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lumina.contract.training_sequence import TrainingSequence


class SyntheticSource:
    """A `PackSource` of made-up sequences, for the packing tests.

    Sample i has base length `base[i]`; in each epoch a seeded coin (probability `drop_prob`) shortens it by
    `drop` tokens (min 1), imitating CFG dropout. Its sequence carries its identity: input_ids[:, 0] = i,
    input_ids[:, 1] = epoch, input_ids[:, c >= 2] = row offset; labels = input_ids; type 3, clean=False.
    """

    def __init__(self, base: Sequence[int], num_codebooks: int = 8, seed: int = 0, drop_prob: float = 0.0,
                 drop: int = 0) -> None:
        if num_codebooks < 2:
            raise ValueError(f"num_codebooks={num_codebooks}: SyntheticSource needs >= 2 (index, epoch)")
        self.base = [int(n) for n in base]
        self.num_codebooks, self.seed, self.drop_prob, self.drop = num_codebooks, seed, drop_prob, drop
        self._cached: tuple[int, list[int]] | None = None  # (epoch, lengths) of the last epoch asked

    def __len__(self) -> int:
        return len(self.base)

    def sample_id(self, index: int) -> str:
        return f"syn-{index}"

    def lengths(self, epoch: int) -> list[int]:
        return list(self._epoch_lengths(epoch))

    def _epoch_lengths(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            coins = np.random.default_rng([self.seed, epoch]).random(len(self.base)) < self.drop_prob
            lengths = [max(1, n - self.drop) if c else n for n, c in zip(self.base, coins.tolist(), strict=True)]
            self._cached = (epoch, lengths)
        return self._cached[1]

    def sequence(self, index: int, epoch: int) -> TrainingSequence:
        n = self._epoch_lengths(epoch)[index]
        ids = torch.arange(n, dtype=torch.int64).unsqueeze(1).repeat(1, self.num_codebooks)
        ids[:, 0], ids[:, 1] = index, epoch
        zeros = torch.zeros(n, dtype=torch.int64)
        return TrainingSequence(
            sample_id=self.sample_id(index), input_ids=ids, labels=ids.clone(),
            type_ids=torch.full((n,), 3, dtype=torch.int64), turn_ids=zeros, block_ids=zeros.clone(),
            position_ids=torch.arange(n, dtype=torch.int64), is_clean=torch.zeros(n, dtype=torch.bool),
            noise_t=torch.full((n,), 0.5), answer_mask=torch.ones(n, dtype=torch.bool))
