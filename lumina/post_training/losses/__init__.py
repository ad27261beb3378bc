"""Post-training loss terms, by name (`LOSS_TERMS`): each turns the policy's likelihood estimates of a rollout
batch (and, where it needs them, the old policy's and the reference's on the same views) plus the rewards
into one loss. `experiment=rl_world` and `objective=grpo|wd1|vrpo|self_distill` choose one (conf/objective/).

    grpo          group-relative advantages (r - group mean; `scale_std` divides by the group std), PPO
                  clipping of the per-token ratio to the old policy, optional k3 KL to the reference
    wd1           ratio-free: - sum softmax(A)_i l_i + sum softmax(-A)_i l_i per group
    vrpo          ELBO-DPO on each group's (best, worst) pair, policy and reference scored on shared views
    self_distill  SFT on the samples the reward accepts (verifier-filtered self-distillation)

l_i is a completion's log-likelihood estimate per scored token (grpo, wd1, self_distill) or its sum (vrpo).
Groups whose rewards are all equal carry no signal: every term but self_distill drops and counts them.
A term names the completions it reads (`reads`); the post-training mode scores only those, so a dropped group
or a rejected sample costs no forward or backward pass.
Normalisers are global over the data-parallel ranks, like the supervised objective's token counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lumina.objective.reduce import dp_sum, dp_world_size
from lumina.parts import Registry

LOSS_TERMS = Registry("loss term", "lumina.post_training.losses")


@dataclass
class LossInputs:
    """One rollout batch of N completions in G-sized groups. logp [N] float32: the policy's estimates (with
    gradients; 0 for a completion the term does not read, which is never scored); old_logp / ref_logp [N]: the
    old policy's / the reference's on the same views (no gradients; None when not computed); rewards [N];
    groups [N] int64 (group ids, local); num_tokens [N] float32 (scored tokens or cells); group: the
    data-parallel process group (None = the default one)."""

    logp: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    num_tokens: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    group: dist.ProcessGroup | None = None


@dataclass
class LossOutput:
    """loss: this rank's share (the ranks' mean is the global loss); metrics: name -> detached scalar."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class LossTerm:
    """A loss term; `needs_reference()`: whether it reads `ref_logp` (then a frozen reference model is kept);
    `reads(rewards, groups)`: bool [N], the completions whose estimates it reads (all by default)."""

    def needs_reference(self) -> bool:
        return False

    def reads(self, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(rewards), dtype=torch.bool)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        raise NotImplementedError


def build_loss_term(spec: dict | str, field_name: str) -> LossTerm:
    """{"name": NAME, **options} (or a bare name) -> the loss term; a bad name or option names the field."""
    options = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = options.pop("name", None)
    cls = LOSS_TERMS.get(name, f"{field_name}.name")
    try:
        return cls(**options)
    except TypeError as error:
        raise ValueError(f"{field_name}: {error} (loss term {name!r})") from None


def group_stats(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (mean [N], population std [N] of each completion's group, number of groups)."""
    ids, inverse = torch.unique(groups, return_inverse=True)
    n = ids.numel()
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(rewards, dtype=torch.float64))
    total = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, rewards.double())
    mean = total / count
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, (rewards.double() - mean[inverse]) ** 2) / count
    return mean[inverse], var.sqrt()[inverse], n


def differing_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """bool [N]: the completions of groups whose rewards are not all equal."""
    return group_stats(rewards, groups)[1] > 0


def global_mean(values: torch.Tensor, count: torch.Tensor | float, group: dist.ProcessGroup | None
                ) -> torch.Tensor:
    """sum(values) / (count summed over the ranks) * world size: the ranks' mean of it is the global mean."""
    device = values.device
    count = torch.as_tensor(count, dtype=torch.float64, device=device).reshape(1)
    total = dp_sum(count, group)[0]
    return values.sum() / total.clamp(min=1).float() * dp_world_size(group)


def global_ratio(numerator: float | torch.Tensor, denominator: float | torch.Tensor, device: torch.device,
                 group: dist.ProcessGroup | None) -> torch.Tensor:
    """sum over the ranks of numerator / sum of denominator (0 when the denominator is): a logged metric."""
    pair = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).detach().reshape(())
                        for v in (numerator, denominator)])
    num, den = dp_sum(pair, group).unbind()
    return (num / den).float() if float(den) > 0 else torch.zeros((), device=device)
