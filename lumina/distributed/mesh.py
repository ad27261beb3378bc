"""The device meshes: dense (replicate x shard), sparse (replicate x expert_fsdp x ep, ep innermost) and, with
sequence parallelism, sequence (dp x sp, sp innermost).

An expert-parallel group is `ep` consecutive ranks inside one dense shard group; a sequence-parallel group
is `sp` consecutive ranks (data-parallel rank r // sp)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lumina.distributed.parallel_config import ResolvedSizes

DENSE_DIMS = ("replicate", "shard")
SPARSE_DIMS = ("replicate", "expert_fsdp", "ep")
SEQUENCE_DIMS = ("dp", "sp")


@dataclass
class Meshes:
    dense: DeviceMesh  # [replicate, shard]
    sparse: DeviceMesh  # [replicate, expert_fsdp, ep]
    sizes: ResolvedSizes
    sequence: DeviceMesh | None = None  # [dp, sp] when sp > 1


_CACHE: dict[tuple, Meshes] = {}
_SEQUENCE_CACHE: dict[tuple, DeviceMesh] = {}


def build_meshes(sizes: ResolvedSizes, device_type: str) -> Meshes:
    """Create the meshes (a collective), cached: FSDP2 needs a parameter's very mesh object."""
    key = (sizes.replicate, sizes.shard, sizes.expert_fsdp, sizes.ep, device_type)
    if not (key in _CACHE and _CACHE[key].dense.get_group("shard") is not None and _alive(_CACHE[key])):
        dense = init_device_mesh(device_type, (sizes.replicate, sizes.shard), mesh_dim_names=DENSE_DIMS)
        sparse = init_device_mesh(device_type, (sizes.replicate, sizes.expert_fsdp, sizes.ep),
                                  mesh_dim_names=SPARSE_DIMS)
        _CACHE[key] = Meshes(dense=dense, sparse=sparse, sizes=sizes)
        _SEQUENCE_CACHE.clear()  # a new process group: the old sequence meshes belong to the old one
    sequence = None
    if sizes.sp > 1:
        sequence_key = (sizes.dp, sizes.sp, device_type)
        if sequence_key not in _SEQUENCE_CACHE:
            _SEQUENCE_CACHE[sequence_key] = init_device_mesh(device_type, (sizes.dp, sizes.sp),
                                                             mesh_dim_names=SEQUENCE_DIMS)
        sequence = _SEQUENCE_CACHE[sequence_key]
    return dataclasses.replace(_CACHE[key], sizes=sizes, sequence=sequence)


def _alive(meshes: Meshes) -> bool:
    """The cached meshes' groups belong to the current default process group (not a destroyed one)."""
    import torch.distributed as dist

    try:
        dist.get_process_group_ranks(meshes.dense.get_group("shard"))
    except (ValueError, RuntimeError):
        return False
    return True
