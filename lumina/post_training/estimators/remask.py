"""`remask` (MaskGRPO): the grid re-masked at a random ratio and every masked cell scored: l ~ U{ceil(r_min n)
.. n} cells, weight n / l (per cell the sum over its C codebooks). With r_min -> 0 its mean is the grid's ELBO;
r_min = 0.6 (MaskGRPO's ratios rise from 0.6 towards 1) trades that for lower variance. `draws` averaged."""

from __future__ import annotations

import math

import torch

from lumina.post_training.estimators import (
    ESTIMATORS,
    LikelihoodEstimator,
    View,
    check_draws,
    random_subset,
    uniform_int,
)
from lumina.post_training.samples import Completion


@ESTIMATORS.register("remask")
class Remask(LikelihoodEstimator):
    modality = "image"

    def __init__(self, min_ratio: float = 0.6, draws: int = 1) -> None:
        if not isinstance(min_ratio, int | float) or not 0.0 < min_ratio <= 1.0:
            raise ValueError(f"estimator remask: min_ratio={min_ratio!r} must lie in (0, 1]")
        self.min_ratio, self.draws = float(min_ratio), check_draws("remask", draws)

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for _ in range(self.draws):
            for i, c in enumerate(completions):
                n = c.num_tokens
                l = uniform_int(max(1, math.ceil(self.min_ratio * n)), n, generator)  # noqa: E741
                mask = random_subset(n, l, generator)
                views.append(View(i, 0, mask, mask, n / l / self.draws))
        return views
