"""`vrpo` (LLaDA 1.5): DPO with ELBO estimates in place of log-likelihoods, on each group's (best, worst) pair
by reward; the policy and the frozen reference are scored on the same views (antithetic masks):

    loss = - mean_pairs log sigmoid(beta * ((L_w - Lref_w) - (L_l - Lref_l))),   L = the estimate's sum

A group whose rewards are all equal has no pair (dropped, counted); only the pairs' completions are read
(scored). Metrics: pair accuracy (margin > 0),
the mean margin, zero-variance share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.post_training.losses import (
    LOSS_TERMS,
    LossInputs,
    LossOutput,
    LossTerm,
    global_mean,
    global_ratio,
)


@LOSS_TERMS.register("vrpo")
class VRPO(LossTerm):
    def __init__(self, beta: float = 0.1) -> None:
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta > 0:
            raise ValueError(f"vrpo: beta={beta!r} must be > 0")
        self.beta = float(beta)

    def needs_reference(self) -> bool:
        return True

    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        read = torch.zeros(len(rewards), dtype=torch.bool)
        winners, losers, _ = _pairs(rewards, groups)
        read[winners + losers] = True
        return read

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if inputs.ref_logp is None:
            raise ValueError("vrpo needs the reference's log-likelihoods (ref_logp)")
        device = inputs.logp.device
        winners, losers, num_groups = _pairs(inputs.rewards, inputs.groups)
        w = torch.tensor(winners, dtype=torch.long, device=device)
        lo = torch.tensor(losers, dtype=torch.long, device=device)
        delta = inputs.logp - inputs.ref_logp
        margin = self.beta * (delta[w] - delta[lo])
        loss = global_mean(-F.logsigmoid(margin), len(winners), inputs.group)
        if not winners:
            loss = loss + 0.0 * inputs.logp.sum()  # no pair on this rank: its graph still joins the step
        metrics = {"pair_accuracy": global_ratio((margin > 0).sum(), len(winners), device, inputs.group),
                   "margin": global_ratio(margin.detach().sum(), len(winners), device, inputs.group),
                   "zero_variance_share": global_ratio(num_groups - len(winners), num_groups, device,
                                                       inputs.group)}
        return LossOutput(loss, metrics)


def _pairs(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[list[int], list[int], int]:
    """-> (winners, losers, number of groups): per group whose rewards differ, the indices of its first best
    and first worst completion."""
    rewards, groups = rewards.cpu(), groups.cpu()
    ids = torch.unique(groups)
    winners, losers = [], []
    for g in ids.tolist():
        member = (groups == g).nonzero().squeeze(1)
        r = rewards[member]
        if bool(r.max() > r.min()):
            winners.append(int(member[r.argmax()]))
            losers.append(int(member[r.argmin()]))
    return winners, losers, ids.numel()
