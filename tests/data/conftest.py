"""Shared fixtures for the data tests: official special tokens and attention-visibility helpers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from sample_helpers import NEWLINE

from lumina.attention import allowed_mask
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.training_sequence import TrainingSequence


@pytest.fixture
def tokens() -> SpecialTokens:
    return SpecialTokens.official(newline=NEWLINE)


def _visible(seq: TrainingSequence) -> torch.Tensor:
    n = len(seq)
    return allowed_mask(torch.ones(n, dtype=torch.bool), torch.tensor([0, n], dtype=torch.int32),
                        seq.type_ids, seq.turn_ids, seq.is_clean, seq.block_ids)[0]


@pytest.fixture
def visible() -> Callable[[TrainingSequence], torch.Tensor]:
    """seq -> [L, L] bool: query row (dim 0) may attend key row (dim 1), by the reference attention rule."""
    return _visible


@pytest.fixture
def keys_of() -> Callable[[TrainingSequence, int], list[int]]:
    """(seq, row) -> the sorted rows `row` may attend."""
    return lambda seq, row: _visible(seq)[row].nonzero().flatten().tolist()


@pytest.fixture
def random_codes() -> Callable[..., torch.Tensor]:
    """(n, num_codebooks=8, high=4096, seed=0) -> [n, C] int64 codes in [0, high)."""
    def make(n: int, num_codebooks: int = 8, high: int = 4096, seed: int = 0) -> torch.Tensor:
        return torch.randint(0, high, (n, num_codebooks), generator=torch.Generator().manual_seed(seed))
    return make
