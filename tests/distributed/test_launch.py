"""`torchrun --nproc_per_node 2 -m lumina.train ... hydra.run.dir=X`: both ranks resolve X, and the run
artefacts (Hydra's .hydra/ and job log, loggers, HF export, heatmap) come from rank 0 only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import free_port

from lumina.distributed.launch import rank_overrides


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path_factory.mktemp("torchrun") / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "lumina.train", "experiment=debug", "strategy=fsdp_ep",
               "strategy.parallel.ep=2", "trainer.devices=2", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
               "trainer.enable_model_summary=false", "data.sources.0.options.num_samples=32",
               "data.sources.0.options.val_samples=4", "callbacks.expert_usage.heatmap_every_n_steps=1",
               f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=run_dir.parent)
    return proc, run_dir


def test_torchrun_trains_and_every_rank_resolves_the_pinned_dir(torchrun) -> None:
    proc, run_dir = torchrun
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert f"all 2 ranks write under the run directory {run_dir}" in log  # a rank disagreeing would raise
    assert proc.stdout.count("lumina-train: 2 optimizer steps") == 1  # the summary comes from rank 0 only


def test_run_artefacts_come_from_rank_zero_only(torchrun) -> None:
    proc, run_dir = torchrun
    log = (run_dir / "train.log").read_text()
    line = f"all 2 ranks write under the run directory {run_dir}"  # logged by both ranks
    assert log.count(line) == 1  # only rank 0 logs to the run directory's job log ...
    assert (proc.stdout + proc.stderr).count(line) == 2  # ... rank 1 to its console only
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "hf" / "config.json").is_file()  # consolidated export written once, by rank 0
    assert (run_dir / "expert_heatmap.png").is_file()


def test_a_distributed_launch_needs_a_pinned_dir_and_no_multirun() -> None:
    env = {"WORLD_SIZE": "2", "RANK": "1"}
    assert rank_overrides(["hydra.run.dir=/x"], {"WORLD_SIZE": "1"}) == []
    assert rank_overrides(["hydra.run.dir=/x"], {**env, "RANK": "0"}) == []
    assert rank_overrides(["hydra.run.dir=/x"], env) == ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    with pytest.raises(ValueError, match="pin hydra.run.dir"):
        rank_overrides(["trainer.max_steps=2"], env)
    with pytest.raises(ValueError, match="multirun"):
        rank_overrides(["-m", "hydra.run.dir=/x"], env)
    lightning_child = ["hydra.run.dir=/x", "hydra.output_subdir=.pl_hydra_rank_1"]
    assert rank_overrides(lightning_child, {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == ["hydra/job_logging=stdout"]
    slurm = {"SLURM_NTASKS": "4", "SLURM_PROCID": "3"}
    assert rank_overrides(["hydra.run.dir=/x"], slurm) == ["hydra.output_subdir=null", "hydra/job_logging=stdout"]


SLURM_TASK = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize("under_submitit", [True, False])
def test_slurm_requeue_belongs_to_submitit_when_it_launched_the_job(monkeypatch, under_submitit) -> None:
    """Under submitit only submitit requeues: the Trainer's SLURM environment must have Lightning's
    auto-requeue (its SIGUSR handler) off; a plain srun job keeps Lightning's default (on)."""
    import lightning as L
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from lumina.distributed import FSDP2ExpertParallelStrategy

    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    if under_submitit:
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    else:
        monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=FSDP2ExpertParallelStrategy(), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    environment = trainer._accelerator_connector.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    assert environment.auto_requeue is (not under_submitit)
    assert trainer.strategy.cluster_environment is environment
