"""`lumina-train` with sequence parallelism: sp=2 on 2 ranks logs the losses of one process on the same packs;
and a job that fails (a bad sp, heads sp cannot split, a failed participation check) after its process group
started ends every rank with a non-zero status, the error printed once and no abort at interpreter exit."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import launch_ranks

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "callbacks.progress_bar=null",
         "data.sources.0.options.num_samples=64", "data.sources.0.options.val_samples=4"]
SP2 = ["strategy=fsdp_ep", "trainer.devices=2", "strategy.parallel.sp=2"]


def _env() -> dict[str, str]:
    """The test's environment, with this directory on PYTHONPATH (`seed_strategy`)."""
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), here])))
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumina.train", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _losses(run_dir: Path) -> list[float]:
    (metrics,) = run_dir.glob("csv/*/metrics.csv")
    return [float(row["train/loss"]) for row in csv.DictReader(metrics.open()) if row.get("train/loss")]


def test_sp2_logs_the_losses_of_one_process(tmp_path: Path) -> None:
    common = ["trainer.max_steps=4", "logger=csv", *QUIET]
    one = _train([*common, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    sp2 = _train([*SP2, *common, f"hydra.run.dir={tmp_path / 'sp2'}"], tmp_path)
    assert sp2.returncode == 0, sp2.stderr[-3000:]
    want, got = _losses(tmp_path / "one"), _losses(tmp_path / "sp2")
    assert len(want) == 4 and len(set(want)) == 4  # four steps on four different packs
    assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize(("overrides", "status", "message"), [
    (["strategy.parallel.sp=3"], 2, "ParallelConfig.sp=3 does not divide the world size 2"),
    (["strategy.parallel.sp=2", "model.config.num_attention_heads=6", "model.config.num_key_value_heads=3"], 2,
     "strategy.parallel.sp=2 and num_key_value_heads=3: one must divide the other"),
    # longest first: the first pack's first half holds no image target, so rank 0 skips the image head
    (["strategy.parallel.sp=2", "strategy._target_=seed_strategy.SeedStrategy", "data.pack_order=longest_first"], 1,
     "conditional modules disagree across ranks before backward"),
], ids=["sp_not_dividing_world", "sp_not_splitting_heads", "participation_check"])
def test_a_failing_job_ends_every_rank_cleanly_with_one_error_line(tmp_path: Path, overrides, status,
                                                                   message) -> None:
    command = [sys.executable, "-m", "lumina.train", "strategy=fsdp_ep", "trainer.devices=2", "trainer.max_steps=2",
               "logger=none", *QUIET, *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    ranks = launch_ranks(command, world=2, cwd=tmp_path, env=_env())
    output = "".join(r.stdout for r in ranks)
    assert [r.returncode for r in ranks] == [status, status], output[-3000:]  # no signal (negative status)
    assert output.count("lumina-train: error:") == 1 and message in output, output[-3000:]
    assert "Traceback" not in output and "terminate called" not in output, output[-3000:]
