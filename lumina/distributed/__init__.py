"""FSDP2 + expert parallelism for lumina: meshes, the parallel plan, the all-to-all MoE dispatcher, the
Lightning strategy, hang proofing, sharded HF load / consolidated export."""

from lumina.distributed.all_to_all_dispatcher import AllToAllDispatcher
from lumina.distributed.dcp_io import load_dcp_weights
from lumina.distributed.grad_norm import clip_grad_norm, total_grad_norm
from lumina.distributed.hf import full_state_dict, load_hf_sharded
from lumina.distributed.mesh import build_meshes
from lumina.distributed.parallel_config import ParallelConfig
from lumina.distributed.parallel_plan import OFFICIAL_PLAN, PlanError, PlanRule, parse_plan, resolve_plan
from lumina.distributed.parallelize import parallelize
from lumina.distributed.participation import ParticipationTracker, tracked_modules
from lumina.distributed.sharded_experts import shard_experts
from lumina.distributed.strategy import FSDP2ExpertParallelStrategy

__all__ = [
    "OFFICIAL_PLAN", "AllToAllDispatcher", "FSDP2ExpertParallelStrategy", "ParallelConfig",
    "ParticipationTracker", "PlanError", "PlanRule", "build_meshes", "clip_grad_norm", "full_state_dict",
    "load_dcp_weights", "load_hf_sharded", "parallelize", "parse_plan", "resolve_plan", "shard_experts",
    "total_grad_norm", "tracked_modules",
]
