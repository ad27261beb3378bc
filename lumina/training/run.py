"""`run(cfg)`: one training run from a composed config; what `lumina-train` calls."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig

from lumina.training import build
from lumina.training.expert_usage import ExpertUsageCallback
from lumina.training.hf_export import HFExportCallback


@dataclass
class RunOutputs:
    output_dir: Path
    steps: int
    wall_s: float
    losses: list[float] = field(default_factory=list)  # train/loss of every optimizer step of this process
    checkpoint: Path | None = None
    hf_export: Path | None = None
    tensorboard: Path | None = None
    heatmap: Path | None = None
    module: L.LightningModule | None = None
    trainer: L.Trainer | None = None


def run(cfg: DictConfig) -> RunOutputs:
    """Build everything from `cfg`, fit, and (on rank 0) print where the outputs are."""
    start = time.perf_counter()
    build.check_requirements(cfg)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    output_dir = Path(cfg.paths.output_dir)
    module = build.module(cfg)
    datamodule = build.datamodule(cfg, module.model_config)
    callbacks = build.callbacks(cfg, module.post_training)
    loggers = build.loggers(cfg)
    trainer = build.trainer(cfg, callbacks, loggers)
    trainer.fit(module, datamodule=datamodule, ckpt_path=build.resume_path(cfg, callbacks))
    outputs = collect_outputs(trainer, module, output_dir, time.perf_counter() - start)
    if trainer.is_global_zero:
        print(summary(outputs), flush=True)
    return outputs


def collect_outputs(trainer: L.Trainer, module, output_dir: Path, wall_s: float) -> RunOutputs:
    outputs = RunOutputs(output_dir=output_dir, steps=trainer.global_step, wall_s=wall_s,
                         losses=list(module.loss_history), module=module, trainer=trainer)
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and Path(callback.last_model_path or "").is_file():
            outputs.checkpoint = Path(callback.last_model_path)
        elif isinstance(callback, HFExportCallback):
            outputs.hf_export = callback.exported
        elif isinstance(callback, ExpertUsageCallback) and callback.heatmaps_written and callback.heatmap_path:
            outputs.heatmap = callback.heatmap_path
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            outputs.tensorboard = Path(logger.log_dir)
    return outputs


def summary(outputs: RunOutputs) -> str:
    lines = [f"lumina-train: {outputs.steps} optimizer steps in {outputs.wall_s:.1f} s; outputs in "
             f"{outputs.output_dir}"]
    if outputs.losses:
        lines.append(f"  train loss     {outputs.losses[0]:.4f} (first step) -> {outputs.losses[-1]:.4f} (last step)")
    rows = [("checkpoint", outputs.checkpoint), ("HF export", outputs.hf_export),
            ("TensorBoard", outputs.tensorboard), ("expert heatmap", outputs.heatmap)]
    lines += [f"  {name:<14} {path}" for name, path in rows if path is not None]
    if outputs.tensorboard is not None:
        lines.append(f"  view with      tensorboard --logdir {outputs.tensorboard}")
    return "\n".join(lines)
