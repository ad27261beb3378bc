"""The sparse MoE block (`mlp` of layers >= first_k_dense_replace): router -> dispatcher (gather -> grouped
experts -> weighted combine), plus the unweighted shared expert. The router is the one
`LuminaConfig.score_function` names (`lumina.model.routers`)."""

from __future__ import annotations

import torch
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.model.experts import GroupedExperts
from lumina.model.mlp import SwiGLU
from lumina.model.moe_dispatch import LocalDispatcher, MoEDispatcher
from lumina.model.routers import ROUTERS, MoERouter, PackRows, Routing


@torch.compiler.disable
def run_experts(dispatcher: MoEDispatcher, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                experts: nn.Module) -> torch.Tensor:
    """`dispatcher.run_experts(...)`, never compiled: the per-expert counts size the GEMM groups (and, expert
    parallel, the all-to-all splits read on the host)."""
    return dispatcher.run_experts(x, topk_ids, topk_weights, experts)


class MoE(nn.Module):
    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        std = config.initializer_range
        self.num_experts = config.num_experts
        self.gate: MoERouter = ROUTERS.build(config.score_function, "LuminaConfig.score_function", config)
        self.experts = GroupedExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size,
                                      backend=config.moe_backend, std=std)
        if config.num_shared_experts is not None:
            self.shared_experts = SwiGLU(config.hidden_size, config.shared_expert_size, std=std)
        else:
            self.shared_experts = None
        self.dispatcher: MoEDispatcher = LocalDispatcher()

    def forward(self, x: torch.Tensor, pack: PackRows | None = None) -> tuple[torch.Tensor, Routing]:
        """x [B, S, H] -> (y [B, S, H], routing of the B*S tokens); `pack`: where they sit in their pack."""
        flat = x.reshape(-1, x.shape[-1])
        routing = self.gate(flat, pack)
        y = run_experts(self.dispatcher, flat, routing.topk_ids, routing.topk_weights, self.experts).view_as(x)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y, routing

