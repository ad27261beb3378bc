"""`logger=wandb` under WANDB_MODE=offline writes an offline run (scalars, run config, the expert heatmap) under
the run's output directory. Skipped where wandb is not installed (it is in the dev extra)."""

from __future__ import annotations

import pytest
from train_helpers import run_cli, small_data

pytest.importorskip("wandb")


def test_logger_wandb_writes_an_offline_run(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["logger=wandb", "experiment=debug", "trainer.max_steps=2",
                      "callbacks.expert_usage.heatmap_every_n_steps=1", "callbacks.checkpoint=null",
                      "callbacks.hf_export=null", "callbacks.progress_bar=null", "trainer.enable_progress_bar=false",
                      *small_data(), f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                     env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    run_id = offline.name.rsplit("-", 1)[1]
    records = (offline / f"run-{run_id}.wandb").read_bytes()
    # the run's records hold the logged scalars and the run config (protobuf strings are stored as bytes)
    for key in (b"train/loss", b"train/tflops", b"experts/cv", b"trainer/global_step", b"bias_rate"):
        assert key in records, key
    heatmaps = list((offline / "files" / "media" / "images" / "experts").glob("load_heatmap_*.png"))
    assert len(heatmaps) == 2  # one per optimizer step
    assert list((run_dir / "csv").glob("version_*/metrics.csv"))  # the local CSV copy of the scalars
