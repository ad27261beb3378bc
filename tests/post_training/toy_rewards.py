"""Rewards with spread for an untrained model (the world's checker gives it zeros): user functions as a run
names them in `reward.<task>` (`_partial_: true`)."""

from __future__ import annotations


def low_codes(prompt, sample) -> float:
    """Share of the picture's first-codebook codes in the lower half of the codebook."""
    first = sample.codes[:, 0]
    return float((first < 32).float().mean())


def short_answer(prompt, sample) -> float:
    """1 for an answer of at most two tokens, else 0."""
    return float(len(sample.answer_ids) <= 2)
