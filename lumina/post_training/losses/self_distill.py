"""`self_distill`: verifier-filtered self-distillation, the cheapest baseline: the masked-diffusion SFT loss
(the estimator's ELBO per scored token, negated) on the model's own completions whose reward reaches
`threshold`, the rest ignored (never scored). Metric: accepted share."""

from __future__ import annotations

import torch

from lumina.post_training.losses import (
    LOSS_TERMS,
    LossInputs,
    LossOutput,
    LossTerm,
    global_mean,
    global_ratio,
)


@LOSS_TERMS.register("self_distill")
class SelfDistill(LossTerm):
    def __init__(self, threshold: float = 1.0) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"self_distill: threshold={threshold!r} must be a number")
        self.threshold = float(threshold)

    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return rewards.cpu() >= self.threshold

    def __call__(self, inputs: LossInputs) -> LossOutput:
        device = inputs.logp.device
        accept = self.reads(inputs.rewards, inputs.groups).to(device)
        logp = inputs.logp / inputs.num_tokens
        accepted = float(accept.sum())
        loss = -global_mean(torch.where(accept, logp, torch.zeros_like(logp)), accepted, inputs.group)
        return LossOutput(loss, {"accepted_share": global_ratio(accepted, len(logp), device, inputs.group)})
