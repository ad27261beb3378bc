"""`blockwise` (SPG / EBPO): every block of the answer at its own noise level, earlier blocks clean, as block
decoding sees it: per block of L slots l ~ U{1..L}, a uniform mask of l slots, scored with weight L / l. The
mean of a block's term is its ELBO, sum_{l=1..L} E[S(M_l)] / l. `draws` independent passes are averaged."""

from __future__ import annotations

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


@ESTIMATORS.register("blockwise")
class Blockwise(LikelihoodEstimator):
    modality = "text"

    def __init__(self, draws: int = 1) -> None:
        self.draws = check_draws("blockwise", draws)

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for _ in range(self.draws):
            for i, c in enumerate(completions):
                for b, (start, stop) in enumerate(c.blocks()):
                    n = stop - start
                    l = uniform_int(1, n, generator)  # noqa: E741
                    mask = random_subset(n, l, generator)
                    views.append(View(i, b, mask, mask, n / l / self.draws))
        return views
