"""Auxiliary-loss-free load balancing: the sign-rule update of each router's expert bias
(`MoERouter.selection_bias()`), from the loads of one optimizer step's micro-batches summed over the ranks:
    bias_i += rate * sign(mean_j load_j - load_i) - mean(update)     (per layer; the update is zero-mean)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lumina.model.routers import MoERouter
from lumina.objective.reduce import dp_sum


def find_expert_biases(model: nn.Module) -> list[torch.Tensor]:
    """Every router's expert bias [E] (`MoERouter.selection_bias`), in module order (= MoE layer order of the
    output lists). A router without one raises ValueError naming it: the update cannot run on it."""
    biases = []
    for name, router in model.named_modules():
        if not isinstance(router, MoERouter):
            continue
        bias = router.selection_bias()
        if bias is None:
            raise ValueError(f"objective.balance.bias_update=true needs an expert bias, but router {name or 'model'!r} "
                             f"({type(router).__module__}.{type(router).__name__}) has none: set "
                             "objective.balance.bias_update=false (and balance it with objective.balance.aux_coef)")
        biases.append(bias)
    return biases


def sign_rule_update(load: torch.Tensor, rate: float) -> torch.Tensor:
    """load [L, E] -> zero-mean update [L, E] = rate * sign(mean load - load), minus its per-layer mean."""
    update = rate * torch.sign(load.mean(dim=-1, keepdim=True) - load)
    return update - update.mean(dim=-1, keepdim=True)


class ExpertBiasUpdater:
    """Accumulates per-layer expert loads [L, E] over micro-batches; `apply` updates the biases once."""

    def __init__(self, rate: float, group: dist.ProcessGroup | None = None) -> None:
        self.rate = rate
        self.group = group
        self.pending: torch.Tensor | None = None  # float64 [L, E] counts since the last apply

    def accumulate(self, load: torch.Tensor) -> None:
        """load [L, E] counts of one micro-batch (valid tokens only)."""
        load = load.detach().double()
        if self.pending is None:
            self.pending = load.clone()
        elif self.pending.shape != load.shape:
            raise ValueError(f"expert load has shape {list(load.shape)}, earlier micro-batches "
                             f"{list(self.pending.shape)}")
        else:
            self.pending += load.to(self.pending.device)

    @torch.no_grad()
    def apply(self, biases: list[torch.Tensor]) -> torch.Tensor | None:
        """Sum the pending counts over ranks, update each bias [E] in place, reset -> the update [L, E] or None."""
        if self.pending is None:
            return None
        if len(biases) != self.pending.shape[0]:
            raise ValueError(f"got {len(biases)} expert_bias buffers for {self.pending.shape[0]} MoE layers")
        load = dp_sum(self.pending, self.group)
        self.pending = None
        update = sign_rule_update(load, self.rate)
        for bias, layer_update in zip(biases, update, strict=True):
            if bias.shape != layer_update.shape:
                raise ValueError(f"expert_bias has shape {list(bias.shape)}, load {list(layer_update.shape)}")
            bias.add_(layer_update.to(device=bias.device, dtype=bias.dtype))
        return update
