"""The two device meshes: dense (replicate x shard) and sparse (replicate x expert_fsdp x ep, ep innermost).

Both span the same ranks in the same order; rank r sits at dense coordinate (r // S, r % S) and sparse
coordinate (r // S, (r % S) // ep, r % ep), so an expert-parallel group is `ep` consecutive ranks inside
one dense shard group."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lumina.distributed.config import ResolvedSizes

DENSE_DIMS = ("replicate", "shard")
SPARSE_DIMS = ("replicate", "expert_fsdp", "ep")


@dataclass
class Meshes:
    dense: DeviceMesh  # [replicate, shard]
    sparse: DeviceMesh  # [replicate, expert_fsdp, ep]
    sizes: ResolvedSizes

    @property
    def ep(self) -> DeviceMesh:
        return self.sparse["ep"]


_CACHE: dict[tuple[ResolvedSizes, str], Meshes] = {}


def build_meshes(sizes: ResolvedSizes, device_type: str) -> Meshes:
    """Create both meshes (a collective: every rank must call it with the same sizes). Meshes are cached per
    (sizes, device type) and process group: DTensor canonicalises equal meshes, and FSDP2 requires a
    parameter's mesh to be the very object it shards over."""
    key = (sizes, device_type)
    if key in _CACHE and _CACHE[key].dense.get_group("shard") is not None and _alive(_CACHE[key]):
        return _CACHE[key]
    dense = init_device_mesh(device_type, (sizes.replicate, sizes.shard), mesh_dim_names=DENSE_DIMS)
    sparse = init_device_mesh(device_type, (sizes.replicate, sizes.expert_fsdp, sizes.ep),
                              mesh_dim_names=SPARSE_DIMS)
    _CACHE[key] = Meshes(dense=dense, sparse=sparse, sizes=sizes)
    return _CACHE[key]


def _alive(meshes: Meshes) -> bool:
    """The cached meshes' groups belong to the current default process group (not a destroyed one)."""
    import torch.distributed as dist

    try:
        dist.get_process_group_ranks(meshes.dense.get_group("shard"))
    except (ValueError, RuntimeError):
        return False
    return True
