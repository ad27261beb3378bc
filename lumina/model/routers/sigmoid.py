"""The released model's router (`score_function: sigmoid`, official `LLaDA2MoeGate`): fp32 sigmoid scores,
group-limited top-k selection on the bias-corrected scores, weights from the unbiased scores.

Its fp32 `expert_bias` [E] moves selection only, by the sign-rule update from outside (no released code
updates it). Selection noise spreads tokens with identical scores, which the bias can only move together, over
the experts whose biased scores lie within about its std."""

from __future__ import annotations

from typing import ClassVar

import torch

from lumina.model.config import LuminaConfig
from lumina.model.routers.base import ROUTERS, MoERouter, PackRows, Routing


class _SelectedScores(torch.autograd.Function):
    """(logits [T, E], scores = sigmoid(logits) [T, E] without grad, ids [T, k]) -> scores.gather(1, ids) [T, k]
    with autograd's gradient of sigmoid(logits).gather(1, ids) to the bit (zero off the selected entries),
    saving the k selected scores and ids instead of the [T, E] scores."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        chosen = scores.gather(1, ids)
        ctx.save_for_backward(chosen, ids)
        ctx.num_experts = logits.shape[1]
        return chosen

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        chosen, ids = ctx.saved_tensors
        grad_logits = grad.new_zeros(grad.shape[0], ctx.num_experts)
        grad_logits.scatter_(1, ids, torch.ops.aten.sigmoid_backward(grad, chosen))
        return grad_logits, None, None


@ROUTERS.register("sigmoid", official=True)
class SigmoidRouter(MoERouter):
    """Routing.logits are pre-sigmoid; topk_weights are the unbiased sigmoid scores of the k selected experts,
    normalised over the k when k > 1, times routed_scaling_factor."""

    BUFFER_DTYPES: ClassVar[dict[str, torch.dtype]] = {"expert_bias": torch.float32}

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__(config)
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.register_buffer("expert_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.expert_bias.zero_()

    def selection_bias(self) -> torch.Tensor:
        return self.expert_bias

    def select(self, biased: torch.Tensor) -> torch.Tensor:
        """Group-limited top-k on biased scores [T, E] -> expert ids [T, k] (descending biased score)."""
        tokens = biased.shape[0]
        grouped = biased.view(tokens, self.n_group, self.num_experts // self.n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep.unsqueeze(-1).expand_as(grouped).reshape(tokens, self.num_experts)
        return biased.masked_fill(~keep, float("-inf")).topk(self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor, pack: PackRows | None = None) -> Routing:
        """x [T, H] (any dtype; runs in fp32); autograd keeps x, the ids and the k selected scores only."""
        logits = self.logits(x)  # [T, E]
        with torch.no_grad():
            scores = logits.sigmoid()
            biased = self.add_selection_noise(scores + self.expert_bias.float(), pack)
            topk_ids = self.select(biased)
        chosen = _SelectedScores.apply(logits, scores, topk_ids)
        return Routing(logits=logits, topk_ids=topk_ids, topk_weights=self.normalise(chosen))

    def weigh(self, logits: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """sigmoid(logits) [T, E] at the ids [T, k] -> combine weights fp32 [T, k] (`normalise`)."""
        return self.normalise(logits.sigmoid().gather(1, topk_ids))

    def normalise(self, chosen: torch.Tensor) -> torch.Tensor:
        """Selected scores [T, k] -> combine weights fp32 [T, k]: normalised over the k (skipped for k = 1, as in
        the official gate), times routed_scaling_factor."""
        if self.top_k > 1:
            chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20)
        return chosen * self.routed_scaling_factor

    def balance_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sigmoid scores normalised over the E experts (what routing selects on, as probabilities)."""
        scores = torch.sigmoid(logits.float())
        return scores / scores.sum(dim=-1, keepdim=True)
