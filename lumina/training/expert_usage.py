"""`ExpertUsageCallback`: how evenly the routers use their experts.

Every optimizer step it logs `load_stats` per MoE layer (`experts/layer{i}/...`), their means over the layers
and the dead experts of all layers together (`experts/dead`). Every `heatmap_every_n_steps` rank 0 draws the
window's rank-summed counts as a layer x expert heatmap to TensorBoard / W&B and to `heatmap_path` (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from lumina.training.expert_stats import draw_heatmap, figure_rgb, load_stats


class ExpertUsageCallback(L.Callback):
    def __init__(self, heatmap_every_n_steps: int = 50, heatmap_path: str | None = None,
                 per_layer: bool = True) -> None:
        if not isinstance(heatmap_every_n_steps, int) or heatmap_every_n_steps < 1:
            raise ValueError(f"callbacks.expert_usage.heatmap_every_n_steps={heatmap_every_n_steps!r}: "
                             "must be an integer >= 1")
        self.heatmap_every_n_steps = heatmap_every_n_steps
        self.heatmap_path = Path(heatmap_path) if heatmap_path else None
        self.per_layer = per_layer
        self._window: torch.Tensor | None = None  # [L, E] rank-summed counts since the last heatmap
        self._window_first_step = 1  # first optimizer step (1-based) in the window
        self.heatmaps_written = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        load = getattr(pl_module, "last_step_expert_load", None)
        if not getattr(pl_module, "step_completed", False) or load is None or load.numel() == 0:
            return
        step_load = trainer.strategy.reduce(load.clone(), reduce_op="sum")
        if self._window is None:
            self._window, self._window_first_step = step_load, trainer.global_step  # steps completed, 1-based
        else:
            self._window = self._window + step_load
        stats = load_stats(step_load)
        scalars = {f"experts/{name}": values.mean().item() for name, values in stats.items()}
        scalars["experts/dead"] = stats["dead"].sum().item()
        if self.per_layer:
            first = _first_moe_layer(pl_module)
            for name, values in stats.items():
                scalars.update({f"experts/layer{first + i}/{name}": v for i, v in enumerate(values.tolist())})
        pl_module.log_dict(scalars, on_step=True, on_epoch=False, batch_size=1)
        if trainer.global_step % self.heatmap_every_n_steps == 0:
            self._draw(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._window is not None:
            self._draw(trainer, pl_module)

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        window, self._window = self._window, None
        if window is None or not trainer.is_global_zero:
            return
        step, first = trainer.global_step, self._window_first_step
        figure = draw_heatmap(window, first_layer=_first_moe_layer(pl_module),
                              title=f"expert load, optimizer steps {first}-{step}")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure("experts/load_heatmap", figure, global_step=step, close=False)
            elif isinstance(logger, WandbLogger):
                logger.log_image(key="experts/load_heatmap", images=[figure_rgb(figure)], step=step)
        if self.heatmap_path is not None:
            self.heatmap_path.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(self.heatmap_path)
        self.heatmaps_written += 1


def _first_moe_layer(pl_module: L.LightningModule) -> int:
    config = getattr(pl_module, "model_config", None)
    return int(getattr(config, "first_k_dense_replace", 0))
