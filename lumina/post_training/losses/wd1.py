"""`wd1`: ratio-free weighted likelihood. Per group, with A = r - group mean:

    loss_group = - sum_i softmax(A)_i l_i + sum_i softmax(-A)_i l_i,    l = logp / tokens

averaged over the groups whose rewards differ (a zero-variance group's two weightings cancel; it is dropped
and counted, its completions never scored). Only the current policy's likelihood is read: no old policy, no
reference.
"""

from __future__ import annotations

import torch

from lumina.post_training.losses import (
    LOSS_TERMS,
    LossInputs,
    LossOutput,
    LossTerm,
    differing_groups,
    global_mean,
    global_ratio,
    group_stats,
)


@LOSS_TERMS.register("wd1")
class WD1(LossTerm):
    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return differing_groups(rewards, groups)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        device = inputs.logp.device
        logp = inputs.logp / inputs.num_tokens
        groups = inputs.groups.cpu()
        mean, std, num_groups = group_stats(inputs.rewards.cpu(), groups)
        advantage = inputs.rewards.cpu().double() - mean
        ids, inverse = torch.unique(groups, return_inverse=True)
        weights = torch.zeros(len(groups), dtype=torch.float64)
        for g in range(ids.numel()):
            member = inverse == g
            a = advantage[member]
            weights[member] = torch.softmax(a, 0) - torch.softmax(-a, 0)
        keep = std > 0
        weights = torch.where(keep, weights, torch.zeros_like(weights)).float().to(device)
        kept_groups = int(torch.unique(groups[keep]).numel())
        loss = -global_mean(weights * logp, kept_groups, inputs.group)
        metrics = {"zero_variance_share": global_ratio(num_groups - kept_groups, num_groups, device, inputs.group)}
        return LossOutput(loss, metrics)
