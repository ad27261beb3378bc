"""Per-rank parameter bytes of a sharded layout, computed from the plan on the meta device (no memory used).

A plan-placed (expert) tensor is split on its plan dim over `ep`, and FSDP2 then splits the local part on
dim 0 over `expert_fsdp`; every other parameter is FSDP2-split on dim 0 over `shard`. FSDP2 pads to equal
chunks of ceil(n / w) rows, so the per-rank figure is that of a first (largest) chunk. Buffers
(expert_bias, channel_mask, rotary inv_freq) are replicated and reported separately.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumina.distributed.config import ResolvedSizes
from lumina.distributed.plan import OFFICIAL_PLAN, PlanRule, expert_parameter_names, resolve_plan
from lumina.model.config import LuminaConfig
from lumina.model.experts import GroupedExperts
from lumina.model.lumina_model import LuminaModel


@dataclass(frozen=True)
class RankBytes:
    expert_params: int  # elements of plan-placed tensors on one rank
    dense_params: int  # elements of every other parameter on one rank
    buffer_bytes: int  # replicated buffers, in their own dtypes
    total_params: int  # elements of the unsharded model

    def param_bytes(self, bytes_per_element: int) -> int:
        return (self.expert_params + self.dense_params) * bytes_per_element


def _rows(n: int, ways: int) -> int:
    return math.ceil(n / ways)


def per_rank_parameters(config: LuminaConfig, sizes: ResolvedSizes,
                        rules: Sequence[PlanRule] = OFFICIAL_PLAN) -> RankBytes:
    with torch.device("meta"):
        model = LuminaModel(config)
    params = dict(model.named_parameters())
    placed = resolve_plan(list(params), rules, expert_parameter_names(model, (GroupedExperts,)))
    expert = dense = 0
    for name, p in params.items():
        shape = list(p.shape)
        if name in placed:
            rule = placed[name]
            shape[rule.dim] = _rows(shape[rule.dim], sizes.ep)
            shape[0] = _rows(shape[0], sizes.expert_fsdp)
            expert += math.prod(shape)
        else:
            shape[0] = _rows(shape[0], sizes.shard)
            dense += math.prod(shape)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return RankBytes(expert, dense, buffers, sum(p.numel() for p in params.values()))
