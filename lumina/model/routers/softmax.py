"""A softmax top-k router (`score_function: softmax`, as Mixtral and Qwen-MoE route): softmax over the E
logits in fp32, the top-k experts by probability (no group limiting), weights the k probabilities,
renormalised over the k when `norm_topk_prob` (Mixtral; Qwen-MoE's switch).

It carries no expert bias: its state is `gate.weight` alone, and balancing it is the auxiliary loss's job
(`objective.balance.aux_coef`, with `bias_update=false`; the bias update refuses it). In training mode the
selection may add noise (`MoERouter.set_selection_noise`) to the probabilities it selects on; the weights
stay noise-free. `n_group`, `topk_group` and `routed_scaling_factor` belong to the sigmoid router and are not
used here."""

from __future__ import annotations

import torch

from lumina.model.config import LuminaConfig
from lumina.model.routers.base import ROUTERS, MoERouter, PackRows, Routing


@ROUTERS.register("softmax")
class SoftmaxTopKRouter(MoERouter):
    """Routing.logits are pre-softmax; topk_weights are softmax(logits) at the k selected experts, divided by
    their sum when norm_topk_prob."""

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__(config)
        self.norm_topk_prob = config.norm_topk_prob
        self.reset_parameters()

    def forward(self, x: torch.Tensor, pack: PackRows | None = None) -> Routing:
        """x [T, H] (any dtype; the router runs in fp32) -> Routing of the T tokens."""
        logits = self.logits(x)  # [T, E]
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            topk_ids = self.add_selection_noise(probs, pack).topk(self.top_k, dim=-1).indices
        return Routing(logits=logits, topk_ids=topk_ids, topk_weights=self.weigh(logits, topk_ids))

    def weigh(self, logits: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """softmax(logits) [T, E] at the ids [T, k] -> combine weights fp32 [T, k] (renormalised over the k when
        norm_topk_prob)."""
        chosen = torch.softmax(logits.float(), dim=-1).gather(1, topk_ids)
        if self.norm_topk_prob:
            chosen = chosen / chosen.sum(dim=-1, keepdim=True)
        return chosen

    def balance_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits) in fp32: the probabilities it routes by (Switch / Mixtral balance loss)."""
        return torch.softmax(logits.float(), dim=-1)
