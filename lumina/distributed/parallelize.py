"""`parallelize`: apply the expert-parallel plan and FSDP2 to a `LuminaModel`, unit by unit.

Units, in `modules()` order: embedding tables, each decoder layer (its experts first, on the sparse mesh),
the heads, then the root; a unit on meta is initialised just before it is sharded (same seed, same weights
under any layout). Every group sums gradients and divides by the world size (the objective scales each loss
by world / N_global), so expert gradients, summed over ep ranks by the all-to-all, match the dense ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import DataParallelMeshDims

from lumina.checkpoint.keys import EXPERT_PROJS
from lumina.distributed.all_to_all_dispatcher import AllToAllDispatcher
from lumina.distributed.mesh import Meshes
from lumina.distributed.parallel_config import ParallelConfig
from lumina.distributed.parallel_plan import PlanError, PlanRule, expert_parameter_names, resolve_plan
from lumina.distributed.sequence_parallel import UlyssesAttention
from lumina.distributed.sharded_experts import shard_experts
from lumina.model.dtypes import float_dtype
from lumina.model.experts import GroupedExperts
from lumina.model.moe import MoE


def mixed_precision(config: ParallelConfig) -> MixedPrecisionPolicy:
    param = float_dtype("param_dtype", config.param_dtype) if config.param_dtype else None
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=float_dtype("reduce_dtype", config.reduce_dtype))


def materialise(module: nn.Module, device: torch.device) -> None:
    """Allocate every tensor of `module` still on meta, then re-initialise each owner (`reset_parameters`,
    in `modules()` order). All are allocated first: a module may initialise tensors its children own (an
    adapter's factors)."""
    owners = [sub for sub in module.modules()
              if any(t is not None and t.is_meta for t in (*sub._parameters.values(), *sub._buffers.values()))]
    for sub in owners:
        sub.to_empty(device=device, recurse=False)
    for sub in owners:
        if hasattr(sub, "reset_parameters"):
            sub.reset_parameters()


def _shard(units: nn.Module | list[nn.Module], mesh, mp: MixedPrecisionPolicy, divide: int, shard_size: int,
           **kwargs) -> None:
    """fully_shard with gradients summed over the group and divided by `divide` exactly once."""
    fully_shard(units, mesh=mesh, mp_policy=mp, **kwargs)
    first = units[0] if isinstance(units, list) else units
    assert isinstance(first, FSDPModule)
    first.set_gradient_divide_factor(float(divide))
    # SUM reductions with a separate division (no PREMUL_SUM, which gloo lacks). Not for a shard group of one:
    # torch 2.13 then divides both in the copy and after it.
    first.set_force_sum_reduction_for_comms(shard_size > 1)


def check_supported(placements: dict[str, PlanRule], experts: Sequence[str]) -> None:
    """Raise PlanError for a placement other than expert tensors on the `ep` mesh dim (else ignored)."""
    expert_set = set(experts)
    others = [n for n in placements if n not in expert_set]
    if others:
        raise PlanError(f"the parallel plan places non-expert parameters, which only FSDP shards here: {others[:4]}")
    wrong = sorted({f"{r.pattern} -> {r.mesh_dim}" for r in placements.values() if r.mesh_dim != "ep"})
    if wrong:
        raise PlanError(f"expert tensors can only be placed on the 'ep' mesh dim, got {wrong}")


def parallelize(model: nn.Module, meshes: Meshes, config: ParallelConfig, rules: Sequence[PlanRule],
                device: torch.device) -> None:
    """Shard LuminaModel `model` in place; PlanError (before any change) when the plan does not fit it."""
    names = [n for n, _ in model.named_parameters()]
    experts = expert_parameter_names(model, (GroupedExperts,))
    placements = resolve_plan(names, rules, experts)
    check_supported(placements, experts)
    if meshes.sequence is not None:  # before any change: a head count sp cannot split raises here
        cores = [UlyssesAttention(meshes.sequence.get_group("sp"), layer.attention.num_heads,
                                  layer.attention.num_kv_heads) for layer in model.model.layers]
        for layer, core in zip(model.model.layers, cores, strict=True):
            layer.attention.core = core
    mp = mixed_precision(config)
    world = meshes.sizes.world_size
    ep_group = meshes.sparse.get_group("ep")
    expert_dims = DataParallelMeshDims(shard="expert_fsdp", replicate="replicate")
    layers = {id(layer): (i, layer) for i, layer in enumerate(model.model.layers)}
    position = {id(m): n for n, m in enumerate(model.modules())}
    units = sorted([*(layer for _, layer in layers.values()), *model.conditional_modules().values()],
                   key=lambda m: position[id(m)])

    for unit in units:
        materialise(unit, device)
        if id(unit) not in layers:  # a conditional module: embedding table(s) or head(s)
            members = list(unit) if isinstance(unit, nn.ModuleList) else unit
            _shard(members, meshes.dense, mp, world, meshes.sizes.shard)
            continue
        i, layer = layers[id(unit)]
        if isinstance(layer.mlp, MoE):
            moe = layer.mlp
            prefix = f"model.layers.{i}.mlp.experts."
            dims = {p: placements[prefix + p].dim for p in EXPERT_PROJS}
            sharded = shard_experts(moe.experts, meshes.sparse, "ep", dims)
            if meshes.sizes.ep > 1:
                moe.dispatcher = AllToAllDispatcher(ep_group, moe.num_experts)
            _shard(sharded, meshes.sparse, mp, world, meshes.sizes.expert_fsdp, dp_mesh_dims=expert_dims)
        _shard(layer, meshes.dense, mp, world, meshes.sizes.shard)
    materialise(model, device)
    _shard(model, meshes.dense, mp, world, meshes.sizes.shard)
