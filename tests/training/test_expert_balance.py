"""The default run (`lumina-train` with no overrides: tiny model, 120 steps) keeps its experts balanced: over its
last 20 optimizer steps no expert of any MoE layer goes without tokens and the mean per-step CV is <= 0.5
(before the balance work: 10 of 16 dead at the end, CV 1.4-1.7)."""

from __future__ import annotations

import csv
import statistics

from train_helpers import compose_train, quiet

from lumina.training.run import run


def test_default_run_ends_with_no_dead_expert_and_a_low_cv(tmp_path):
    # the default config; switched off only what does not touch training (validation, checkpoint, export)
    cfg = compose_train([*quiet(tmp_path), "logger=csv", "trainer.limit_val_batches=0", "callbacks.checkpoint=null",
                         "callbacks.hf_export=null", "callbacks.expert_usage.heatmap_path=null"])
    assert cfg.trainer.max_steps == 120 and cfg.model.config.num_experts == 8
    outputs = run(cfg)
    assert outputs.steps == 120
    [metrics] = list((tmp_path / "csv").glob("version_*/metrics.csv"))
    rows = {int(r["step"]): r for r in csv.DictReader(metrics.open()) if r.get("experts/cv")}
    assert sorted(rows) == list(range(120))
    last = [rows[step] for step in range(100, 120)]
    dead = [float(r["experts/dead"]) for r in last]  # over both MoE layers, out of 16
    assert dead == [0.0] * 20, dead
    for layer in (1, 2):
        assert all(float(r[f"experts/layer{layer}/dead"]) == 0 for r in last)
    cvs = [float(r["experts/cv"]) for r in last]
    assert statistics.mean(cvs) <= 0.5, cvs
