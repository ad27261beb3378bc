"""`trajectory` (Mask-GRPO): replay of the MaskGIT sampler's own path. At step s the state is the grid with
every cell committed before s clean and the rest masked; the cells committed at s are scored, each cell's
log-probability summed over its C codebooks (the channel head teacher-forced on the drawn codes). The sum over
steps is the exact log-probability of the sampled codes along that path (unguided sampling; the choice of which
cells to keep, a Gumbel top-k on confidence, is not scored: Mask-GRPO's default)."""

from __future__ import annotations

import torch

from lumina.post_training.estimators import ESTIMATORS, LikelihoodEstimator, View
from lumina.post_training.samples import Completion


@ESTIMATORS.register("trajectory")
class Trajectory(LikelihoodEstimator):
    modality = "image"

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for i, c in enumerate(completions):
            if c.commit_step is None:
                raise ValueError(f"estimator trajectory: completion of prompt {c.prompt.prompt.key!r} has no "
                                 "commit_step (roll out with lumina.post_training.rollout)")
            for step in torch.unique(c.commit_step).tolist():
                views.append(View(i, 0, c.commit_step >= step, c.commit_step == step, 1.0))
        return views
