"""train/flops, train/tflops and train/mfu per optimizer step; the GPU peak table; the analytic FLOPs in the
model summary and the step progress bar of a real `lumina-train` run."""

from __future__ import annotations

import csv
import re
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count
from train_helpers import compose_train, quiet, run_cli, small_data

from lumina.model.flops import batch_flops, nominal_attention_pairs, training_flops
from lumina.model.supervision import PackRows
from lumina.training import build
from lumina.training.throughput import ThroughputCallback, table_peak_tflops


class StepBatches(L.Callback):
    """The micro-batches of each optimizer step (by the step they belong to)."""

    def __init__(self) -> None:
        self.by_step: dict[int, list] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.by_step.setdefault(trainer.global_step, []).append(batch)


def test_each_step_logs_its_flops_achieved_rate_and_mfu(tmp_path):
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), *small_data(), "logger=csv", "trainer.max_steps=3",
                         "trainer.accumulate_grad_batches=2", "trainer.limit_val_batches=0"])
    module = build.module(cfg)
    batches, throughput = StepBatches(), ThroughputCallback(peak_tflops=2.0)
    trainer = build.trainer(cfg, [batches, throughput], build.loggers(cfg))
    start = time.perf_counter()
    trainer.fit(module, datamodule=build.datamodule(cfg, module.model_config))
    wall = time.perf_counter() - start
    [metrics] = list((tmp_path / "csv").glob("version_*/metrics.csv"))
    rows = {int(r["step"]): r for r in csv.DictReader(metrics.open()) if r.get("train/tflops")}
    assert sorted(rows) == [0, 1, 2] and all(len(batches.by_step[s]) == 2 for s in rows)
    backend = module.model.model.attn_backend
    seconds = []
    for step, row in rows.items():
        want = sum(batch_flops(module.model_config, b, backend) for b in batches.by_step[step])
        assert float(row["train/flops"]) == want
        assert float(row["train/mfu"]) == pytest.approx(float(row["train/tflops"]) / 2.0)
        seconds.append(want / (float(row["train/tflops"]) * 1e12))  # the step time the rate implies
    assert all(s > 0 for s in seconds) and sum(seconds) < wall
    assert throughput.peak_source == "configured"


@pytest.mark.parametrize(("name", "dtype", "peak"), [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.0),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.0),
    ("NVIDIA H100 NVL", torch.float16, 835.0),
    ("NVIDIA H200", torch.bfloat16, 989.0),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312.0),
    ("NVIDIA A100 80GB PCIe", torch.bfloat16, 312.0),
    ("NVIDIA H100 80GB HBM3", torch.float32, None),  # fp32 / tf32: not in the table
    ("Tesla T4", torch.bfloat16, None),
])
def test_gpu_peak_table(name: str, dtype: torch.dtype, peak: float | None) -> None:
    assert table_peak_tflops(name, dtype) == peak


def test_bad_peak_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"callbacks.throughput.peak_tflops=-1"):
        ThroughputCallback(peak_tflops=-1)


def test_cli_run_shows_step_progress_summary_flops_and_the_cpu_probe(tmp_path):
    """The default callbacks of a real run: the rich bar counts steps, the summary's Total FLOPs is the analytic
    count of the nominal pack, and train/mfu is train/tflops over the GEMM probe's peak named in the log."""
    run_dir = tmp_path / "run"
    result = run_cli(["experiment=debug", "trainer.max_steps=3", "logger=csv", "callbacks.checkpoint=null",
                      "callbacks.hf_export=null", *small_data(), f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Epoch 0/-2" not in out and re.search(r"step\s+\S+ 3/3", out), out[-2000:]
    cfg = compose_train(["experiment=debug", *small_data()])
    config = build.model_config(cfg)
    rows = PackRows.assume(256, **cfg.memory_pack)
    expected = training_flops(config, rows, nominal_attention_pairs(rows, "segmented"))
    assert f"Total FLOPs: {get_human_readable_count(expected)}" in out
    peak = re.search(r"MFU peak: ([0-9.e-]+) TFLOP/s \(CPU GEMM probe", (run_dir / "train.log").read_text())
    assert peak, (run_dir / "train.log").read_text()
    [metrics] = list((run_dir / "csv").glob("version_*/metrics.csv"))
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/mfu")]
    assert len(rows) == 3
    for row in rows:  # the log rounds the peak to 4 digits
        assert float(row["train/mfu"]) * float(peak.group(1)) == pytest.approx(float(row["train/tflops"]), rel=1e-3)
