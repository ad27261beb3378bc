"""`trace` (TraceRL): replay of the block-diffusion text sampler's own path. In block b at step s the state is
the block with every slot committed before s clean and the rest masked (earlier blocks clean, as the sampler
had them); the slots committed at s are scored. The sum over blocks and steps is the exact log-probability of
the sampled tokens along that path (which slots to commit, the top-confidence choice, is not scored), at one
pass per sampler step. The image counterpart is `trajectory`."""

from __future__ import annotations

import torch

from lumina.post_training.estimators import ESTIMATORS, LikelihoodEstimator, View
from lumina.post_training.samples import Completion


@ESTIMATORS.register("trace")
class Trace(LikelihoodEstimator):
    modality = "text"

    def plan(self, completions: list[Completion], generator: torch.Generator) -> list[View]:
        self.check(completions)
        views = []
        for i, c in enumerate(completions):
            if c.commit_step is None or len(c.commit_step) != len(c.ids):
                raise ValueError(f"estimator trace: completion of prompt {c.prompt.prompt.key!r} has no commit_step "
                                 "for each token (roll out with lumina.post_training.rollout)")
            for b, (start, stop) in enumerate(c.blocks()):
                when = c.commit_step[start:stop]
                for step in torch.unique(when).tolist():
                    views.append(View(i, b, when >= step, when == step, 1.0))
        return views
