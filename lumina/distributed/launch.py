"""Launching lumina-train as one rank of a distributed job (torchrun, SLURM srun, submitit)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment


def launch_rank(env: Mapping[str, str] = os.environ) -> int:
    """Global rank: torchrun's RANK, srun's SLURM_PROCID, else LOCAL_RANK (Lightning's single-node launcher)."""
    return int(env.get("RANK", env.get("SLURM_PROCID", env.get("LOCAL_RANK", "0"))))


def launch_world_size(env: Mapping[str, str] = os.environ) -> int:
    return int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))


def rank_overrides(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> list[str]:
    """Extra Hydra overrides for this rank (only rank 0 writes Hydra's artefacts), applied before Hydra runs.
    ValueError without a pinned `hydra.run.dir` or with --multirun (sweep with the submitit launcher)."""
    if launch_world_size(env) <= 1:
        return []
    if any(arg in ("-m", "--multirun") or arg.startswith("hydra.mode=MULTIRUN") for arg in argv):
        raise ValueError("Hydra multirun inside a distributed job would start one sweep per rank; launch each "
                         "sweep point as its own distributed job (hydra/launcher=slurm_ddp)")
    if not any(arg.startswith("hydra.run.dir=") for arg in argv):
        raise ValueError(f"this is rank {launch_rank(env)} of {launch_world_size(env)}: pin hydra.run.dir=<dir> "
                         "so that every rank resolves the same run directory")
    if launch_rank(env) != 0:  # Lightning's own launcher already sets hydra.output_subdir for its children
        extra = {"hydra.output_subdir": "null", "hydra/job_logging": "stdout"}
        return [f"{key}={value}" for key, value in extra.items()
                if not any(arg.split("=", 1)[0].lstrip("+~") == key for arg in argv)]
    return []


def cluster_environment(env: Mapping[str, str] = os.environ) -> ClusterEnvironment | None:
    """SLURM without Lightning's requeue handler under submitit (submitit requeues); None: autodetect."""
    if "SUBMITIT_EXECUTOR" in env and SLURMEnvironment.detect():
        return SLURMEnvironment(auto_requeue=False)
    return None
