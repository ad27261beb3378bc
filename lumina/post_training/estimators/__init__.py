"""Likelihood estimators for a sampled answer, by name (`ESTIMATORS`). log pi(y | x) of a masked-diffusion
answer is intractable; each estimator stands in a sum over `View`s: partly masked copies of the answer, each
scoring some of its masked positions with a weight (`lumina.post_training.scoring.score_views` runs them).
An estimator only plans the views, from a generator; the same plan scored under two models (policy and
reference, new and old policy) shares masks, the antithetic sharing VRPO and PPO-style ratios need.

    text  one_step   every block fully masked, earlier blocks clean (d1; one pass)
          coupled    per block a mask M of l ~ U{1..L-1} slots and its complement, plus the fully masked block,
                     weighted so the mean is the block-diffusion ELBO (coupled-GRPO)
          blockwise  per block its own l ~ U{1..L} masked slots, weight L / l (SPG / EBPO: matches block decoding)
          trace      the sampler's own steps replayed, block by block: at step s the slots committed from s on
                     are masked and those committed at s scored (TraceRL; exact log-probability of the path)
    image trajectory the sampler's own steps replayed: at step s the cells committed from s on are masked and
                     those committed at s scored (Mask-GRPO; exact log-probability of the sampled path)
          remask     l ~ U{ceil(r_min n)..n} random cells masked and scored, weight n / l (MaskGRPO)

The ELBO of an L-token block (given clean earlier blocks) is sum_{l=1..L} (1 / l) E_{|M| = l} sum_{i in M}
log p(x_i | x outside M); `one_step`, `coupled` and `blockwise` are estimates of (or, one_step, a bound on) it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from lumina.parts import Registry
from lumina.post_training.samples import Completion

ESTIMATORS = Registry("likelihood estimator", "lumina.post_training.estimators")
MODALITIES = ("text", "image")


@dataclass
class View:
    """One scored copy of completion `sample`. Text: block `block` of its answer (earlier blocks clean, later
    ones absent, as the sampler saw it); image: the whole grid (block 0). masked: bool [n] over the block's
    slots / the grid's cells, shown as the mask id; scored: bool [n], a subset of masked, whose log-probs count
    with `weight`."""

    sample: int
    block: int
    masked: torch.Tensor
    scored: torch.Tensor
    weight: float


class LikelihoodEstimator:
    """Plans the views whose weighted log-prob sum estimates log pi(answer | prompt) of each completion.
    `modality` is the kind of answer it scores; options are constructor keywords."""

    modality: ClassVar[str]

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        raise NotImplementedError

    def check(self, completions: list[Completion]) -> None:
        """Raise naming the estimator when a completion is not of its modality."""
        name = type(self).__name__
        for c in completions:
            if c.is_image != (self.modality == "image"):
                raise ValueError(f"estimator {name} scores {self.modality} answers; completion of task "
                                 f"{c.prompt.task!r} is {'an image' if c.is_image else 'text'}")


def build_estimator(spec: dict | str, field: str) -> LikelihoodEstimator:
    """{"name": NAME, **options} (or a bare name) -> the estimator; a bad name or option names `field`."""
    options = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = options.pop("name", None)
    cls = ESTIMATORS.get(name, f"{field}.name")
    try:
        return cls(**options)
    except TypeError as error:
        raise ValueError(f"{field}: {error} (estimator {name!r})") from None


def check_draws(estimator: str, draws: int) -> int:
    """`draws` (independent passes to average) as given; ValueError naming the estimator unless an int >= 1."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"estimator {estimator}: draws={draws!r} must be an integer >= 1")
    return draws


def random_subset(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """bool [n] with `size` True at uniformly random places."""
    out = torch.zeros(n, dtype=torch.bool)
    out[torch.randperm(n, generator=generator)[:size]] = True
    return out


def uniform_int(low: int, high: int, generator: torch.Generator) -> int:
    """An integer uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))
