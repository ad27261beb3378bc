"""`ShardedGroupedExperts`: the model's routed experts with their fused [E, ...] projections held as DTensors
sharded over the expert-parallel mesh dim (Shard(0) on `ep`, Replicate on the data-parallel dims), so
checkpoints see the global tensors. Same parameter names as `GroupedExperts` (`gate_proj`, `up_proj`,
`down_proj`), so state-dict keys are unchanged. The forward computes on the local expert slice."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from lumina.model.experts import GroupedExperts, RoutedCopies, check_tokens_per_expert, swiglu_experts

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if isinstance(weight, DTensor) else weight


class ShardedGroupedExperts(nn.Module):
    """Built from a `GroupedExperts` holding all E experts (materialised or on meta) and a mesh whose dim
    `ep_dim` splits them; `dims` maps each projection to the tensor dim the plan shards (0 = experts)."""

    def __init__(self, experts: GroupedExperts, mesh: DeviceMesh, ep_dim: str = "ep",
                 dims: dict[str, int] | None = None) -> None:
        super().__init__()
        dims = dims or dict.fromkeys(PROJECTIONS, 0)
        ep = mesh[ep_dim].size()
        num_experts = experts.num_local_experts
        if num_experts % ep:
            raise ValueError(f"num_experts={num_experts} is not divisible by the expert-parallel size {ep}")
        if any(d != 0 for d in dims.values()):
            raise ValueError(f"expert projections must be sharded on dim 0 (the expert dim), got {dims}")
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep
        self.backend = experts.backend
        self.std = experts.std
        ep_index = mesh.mesh_dim_names.index(ep_dim)
        self.placements = tuple(Shard(0) if i == ep_index else Replicate() for i in range(mesh.ndim))
        first = mesh[ep_dim].get_local_rank() * self.num_local_experts  # this rank's first expert
        for name in PROJECTIONS:
            full = getattr(experts, name)
            local = full.detach()[first:first + self.num_local_experts].clone()
            dtensor = DTensor.from_local(local, mesh, self.placements, run_check=False,
                                         shape=full.shape, stride=full.stride())
            self.register_parameter(name, nn.Parameter(dtensor, requires_grad=full.requires_grad))

    def reset_parameters(self) -> None:
        """Re-draw the local slice N(0, std) (rank-local random stream)."""
        with torch.no_grad():
            for name in PROJECTIONS:
                _local(getattr(self, name)).normal_(0.0, self.std)

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                copies: RoutedCopies | None = None) -> torch.Tensor:
        """x [N, H] sorted by local expert; tokens_per_expert int [E_local] -> [N, H]. With `copies` (a
        `LocalDispatcher` where the ep size is 1): x [T, H] tokens -> their weighted sum [T, H]."""
        check_tokens_per_expert(tokens_per_expert, self.num_local_experts)
        gate, up, down = (_local(getattr(self, name)) for name in PROJECTIONS)
        return swiglu_experts(x, gate, up, down, tokens_per_expert, self.backend, copies)
