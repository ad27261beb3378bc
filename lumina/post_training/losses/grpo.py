"""`grpo`: group-relative policy optimisation on per-token log-likelihood estimates l = logp / tokens.

    A_i = r_i - mean_group(r)                    (/ std_group(r) with scale_std; off by default, as d1)
    rho_i = exp(l_i - l_old_i)                   (1 at inner epoch 0: l_old is l detached)
    loss = - mean_kept min(rho A, clip(rho, 1 - eps, 1 + eps) A) + kl_coef * mean_all k3
    k3 = exp(l_ref - l) - (l_ref - l) - 1        (only with kl_coef > 0: then a frozen reference is kept)

Kept: completions of groups whose rewards differ (a zero-variance group has A = 0 everywhere); without the KL
term only those are read (scored). Metrics:
clip_fraction (share of kept completions on the clipped branch), kl (mean k3 over all completions),
zero_variance_share (share of groups dropped).
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


@LOSS_TERMS.register("grpo")
class GRPO(LossTerm):
    def __init__(self, clip_eps: float = 0.2, kl_coef: float = 0.0, scale_std: bool = False) -> None:
        if isinstance(clip_eps, bool) or not isinstance(clip_eps, int | float) or not clip_eps > 0:
            raise ValueError(f"grpo: clip_eps={clip_eps!r} must be > 0")
        if isinstance(kl_coef, bool) or not isinstance(kl_coef, int | float) or kl_coef < 0:
            raise ValueError(f"grpo: kl_coef={kl_coef!r} must be >= 0")
        if not isinstance(scale_std, bool):
            raise ValueError(f"grpo: scale_std={scale_std!r} must be true or false")
        self.clip_eps, self.kl_coef, self.scale_std = float(clip_eps), float(kl_coef), scale_std

    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        """The kept completions; every one with the KL term (its mean runs over all)."""
        return super().reads(rewards, groups) if self.kl_coef > 0 else differing_groups(rewards, groups)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        device = inputs.logp.device
        logp = inputs.logp / inputs.num_tokens
        old = (inputs.old_logp if inputs.old_logp is not None else inputs.logp.detach()) / inputs.num_tokens
        mean, std, num_groups = group_stats(inputs.rewards.cpu(), inputs.groups.cpu())
        advantage = inputs.rewards.cpu().double() - mean
        if self.scale_std:
            advantage = advantage / (std + 1e-4)
        keep = (std > 0).to(device)
        advantage = advantage.float().to(device)
        ratio = torch.exp(logp - old)
        clipped = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps)
        surrogate = torch.minimum(ratio * advantage, clipped * advantage)
        zero = torch.zeros_like(surrogate)
        kept = float(keep.sum())
        loss = -global_mean(torch.where(keep, surrogate, zero), kept, inputs.group)
        metrics = {}
        if self.kl_coef > 0:
            if inputs.ref_logp is None:
                raise ValueError("grpo: kl_coef > 0 needs the reference's log-likelihoods (ref_logp)")
            delta = inputs.ref_logp / inputs.num_tokens - logp
            k3 = torch.exp(delta) - delta - 1
            loss = loss + self.kl_coef * global_mean(k3, len(k3), inputs.group)
            metrics["kl"] = global_ratio(k3.sum(), len(k3), device, inputs.group)
        on_clip = (clipped * advantage < ratio * advantage).detach() & keep
        kept_groups = torch.unique(inputs.groups.to(device)[keep]).numel()
        metrics["clip_fraction"] = global_ratio(on_clip.sum(), kept, device, inputs.group)
        metrics["zero_variance_share"] = global_ratio(num_groups - kept_groups, num_groups, device, inputs.group)
        return LossOutput(loss, metrics)
