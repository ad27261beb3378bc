"""`one_step` (d1 / diffu-GRPO): each block of the answer fully masked with the earlier blocks clean, every slot
scored once, weight 1. One pass; a lower bound on the block's log-likelihood (the l = L term of its ELBO times
L). d1 also masks 15% of the prompt; lumina never trains on a noisy prompt, so the prompt stays clean here."""

from __future__ import annotations

import torch

from lumina.post_training.estimators import ESTIMATORS, LikelihoodEstimator, View
from lumina.post_training.samples import Completion


@ESTIMATORS.register("one_step")
class OneStep(LikelihoodEstimator):
    modality = "text"

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for i, c in enumerate(completions):
            for b, (start, stop) in enumerate(c.blocks()):
                full = torch.ones(stop - start, dtype=torch.bool)
                views.append(View(i, b, full, full, 1.0))
        return views
