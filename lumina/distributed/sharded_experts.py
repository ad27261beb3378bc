"""`shard_experts`: a layer's `GroupedExperts` with its fused [E, ...] projections turned, in place, into
DTensors sharded Shard(0) over the `ep` mesh dim (Replicate elsewhere): checkpoints see the global tensors,
the forward computes on this rank's E / ep experts. A LoRA adapter's per-expert factors (`LoRAGroupedExperts`)
are split along E with the projections they adapt, so each rank holds its own experts' factors."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from lumina.adapters import LoRAGroupedExperts
from lumina.checkpoint.keys import EXPERT_PROJS
from lumina.model.experts import GroupedExperts, experts_per_rank


def shard_experts(experts: GroupedExperts, mesh: DeviceMesh, ep_dim: str = "ep",
                  dims: dict[str, int] | None = None) -> GroupedExperts:
    """Keep this rank's slice of `experts` (all E experts, materialised) as DTensors on `mesh`, split over dim
    `ep_dim`; `dims`: each projection's sharded tensor dim (only 0). Returns `experts`, now E / ep local."""
    dims = dims or dict.fromkeys(EXPERT_PROJS, 0)
    if any(d != 0 for d in dims.values()):
        raise ValueError(f"expert projections must be sharded on dim 0 (the expert dim), got {dims}")
    num_local = experts_per_rank(experts.num_local_experts, mesh[ep_dim].size())
    ep_index = mesh.mesh_dim_names.index(ep_dim)
    placements = tuple(Shard(0) if i == ep_index else Replicate() for i in range(mesh.ndim))
    first = mesh[ep_dim].get_local_rank() * num_local  # this rank's first expert
    stacked = {name: getattr(experts, name) for name in EXPERT_PROJS}
    if isinstance(experts, LoRAGroupedExperts):
        stacked.update(experts.stacked_factors())
    for name, full in stacked.items():
        local = full.detach()[first:first + num_local].clone()
        dtensor = DTensor.from_local(local, mesh, placements, run_check=False, shape=full.shape,
                                     stride=full.stride())
        owner, _, leaf = name.rpartition(".")
        (experts.get_submodule(owner) if owner else experts).register_parameter(
            leaf, nn.Parameter(dtensor, requires_grad=full.requires_grad))
    experts.num_local_experts = num_local
    return experts
