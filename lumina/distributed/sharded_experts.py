"""`shard_experts`: a layer's `GroupedExperts` with its fused [E, ...] projections turned, in place, into
DTensors sharded over the expert-parallel mesh dim (Shard(0) on `ep`, Replicate on the data-parallel dims), so
checkpoints see the global tensors under the same names. The module stays the experts module: its forward
computes on this rank's E / ep experts (`GroupedExperts` takes the DTensors' local slices)."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from lumina.model.experts import GroupedExperts, experts_per_rank

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def shard_experts(experts: GroupedExperts, mesh: DeviceMesh, ep_dim: str = "ep",
                  dims: dict[str, int] | None = None) -> GroupedExperts:
    """Keep this rank's slice of `experts` (holding all E experts, materialised) as DTensor parameters on
    `mesh`, whose dim `ep_dim` splits the experts; `dims` maps each projection to the tensor dim the plan
    shards (0 = experts, the only one supported). Returns `experts`, now holding E / ep local experts."""
    dims = dims or dict.fromkeys(PROJECTIONS, 0)
    if any(d != 0 for d in dims.values()):
        raise ValueError(f"expert projections must be sharded on dim 0 (the expert dim), got {dims}")
    num_local = experts_per_rank(experts.num_local_experts, mesh[ep_dim].size())
    ep_index = mesh.mesh_dim_names.index(ep_dim)
    placements = tuple(Shard(0) if i == ep_index else Replicate() for i in range(mesh.ndim))
    first = mesh[ep_dim].get_local_rank() * num_local  # this rank's first expert
    for name in PROJECTIONS:
        full = getattr(experts, name)
        local = full.detach()[first:first + num_local].clone()
        dtensor = DTensor.from_local(local, mesh, placements, run_check=False, shape=full.shape,
                                     stride=full.stride())
        setattr(experts, name, nn.Parameter(dtensor, requires_grad=full.requires_grad))
    experts.num_local_experts = num_local
    return experts
