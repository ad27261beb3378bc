"""FSDP2 + expert parallelism for lumina: meshes, the parallel plan, the all-to-all MoE dispatcher, the
Lightning strategy, hang proofing, sharded HF load / consolidated export."""

from lumina.distributed.config import ParallelConfig, ResolvedSizes
from lumina.distributed.dcp_io import load_dcp_weights
from lumina.distributed.dispatcher import AllToAllDispatcher
from lumina.distributed.grad_norm import clip_grad_norm, total_grad_norm
from lumina.distributed.hf import export_hf, full_state_dict, load_hf_sharded
from lumina.distributed.mesh import Meshes, build_meshes
from lumina.distributed.parallelize import Parallelized, materialise, parallelize
from lumina.distributed.participation import (
    ParticipationError,
    ParticipationTracker,
    tracked_modules,
)
from lumina.distributed.plan import OFFICIAL_PLAN, PlanError, PlanRule, parse_plan, resolve_plan
from lumina.distributed.sharded_experts import shard_experts
from lumina.distributed.strategy import FSDP2ExpertParallelStrategy, MeshAwarePrecision

__all__ = [
    "OFFICIAL_PLAN", "AllToAllDispatcher", "FSDP2ExpertParallelStrategy", "MeshAwarePrecision", "Meshes",
    "ParallelConfig", "Parallelized", "ParticipationError", "ParticipationTracker", "PlanError", "PlanRule",
    "ResolvedSizes", "build_meshes", "clip_grad_norm", "shard_experts",
    "export_hf", "load_dcp_weights", "full_state_dict", "load_hf_sharded", "materialise", "parallelize",
    "parse_plan", "resolve_plan", "total_grad_norm", "tracked_modules",
]
