"""`coupled` (coupled-GRPO / DiffuCoder): per block of L slots, l ~ U{1..L-1}, a uniform mask M of l slots and
its complement (each slot scored exactly once across the pair), plus the fully masked block:

    estimate = (L - 1) / 2 * (S(M) / l + S(M^c) / (L - l)) + S(all) / L,   S(A) = sum_{i in A} log p(x_i | x_not A)

M^c is uniform of size L - l, itself uniform on {1..L-1}, so the mean is sum_{l=1..L} E[S(M_l)] / l: the ELBO
exactly (a 1-slot block: the fully masked term alone). `draws` independent triples are averaged."""

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


@ESTIMATORS.register("coupled")
class Coupled(LikelihoodEstimator):
    modality = "text"

    def __init__(self, draws: int = 1) -> None:
        self.draws = check_draws("coupled", draws)

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for _ in range(self.draws):
            for i, c in enumerate(completions):
                for b, (start, stop) in enumerate(c.blocks()):
                    n = stop - start
                    full = torch.ones(n, dtype=torch.bool)
                    views.append(View(i, b, full, full, 1.0 / n / self.draws))
                    if n == 1:
                        continue
                    l = uniform_int(1, n - 1, generator)  # noqa: E741
                    mask = random_subset(n, l, generator)
                    half = (n - 1) / 2 / self.draws
                    views.append(View(i, b, mask, mask, half / l))
                    views.append(View(i, b, ~mask, ~mask, half / (n - l)))
        return views
