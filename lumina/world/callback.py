"""`GenerationEvalCallback`: every N optimizer steps and at the end of training, generate on the built-in
world's held-out split (`evaluate_world`, on every rank) and log the scores and a sample grid; rank 0 writes
`<dirpath>/step<N>.png` and `.json`."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.tokenizers.pixels import save_png
from lumina.world.evaluation import (
    WorldEvalConfig,
    WorldEvalResult,
    WorldEvalSet,
    build_eval_set,
    evaluate_world,
)


class GenerationEvalCallback(L.Callback):
    """every_n_steps: 0 = only at the end (at_end); num_items: items per task; image_steps / cfg_scale /
    edit_cfg_scale / temperature / guidance: image sampling; text_length: answer budget in tokens; text_block:
    text block length; text_steps: text denoising steps per block."""

    def __init__(self, dirpath: str, every_n_steps: int = 0, at_end: bool = True, split: str = "val",
                 num_items: int = 16, seed: int = 0, image_steps: int = 16, cfg_scale: float = 2.0,
                 edit_cfg_scale: float = 1.0, temperature: float = 1.0, text_block: int = 16,
                 text_steps: int = 8, guidance: str = "hidden", text_length: int = 16) -> None:
        if every_n_steps < 0:
            raise ValueError(f"GenerationEvalCallback.every_n_steps={every_n_steps}: must be >= 0")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.at_end = at_end
        self.config = WorldEvalConfig(
            split=split, num_items=num_items, seed=seed,
            text=TextSamplingConfig(gen_length=text_length, block_length=text_block, steps=text_steps),
            image=ImageSamplingConfig(steps=image_steps, temperature=temperature, cfg_scale=cfg_scale,
                                      guidance=guidance),
            edit_image=ImageSamplingConfig(steps=image_steps, temperature=temperature, cfg_scale=edit_cfg_scale,
                                           guidance=guidance))
        self._eval_set: WorldEvalSet | None = None
        self._last_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_step:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end and trainer.global_step != self._last_step:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> WorldEvalResult:
        step = trainer.global_step
        self._last_step = step
        if self._eval_set is None:
            self._eval_set = build_eval_set(self.config)
        model = pl_module.model
        was_training = model.training
        model.eval()
        try:
            result = evaluate_world(model, self._eval_set, self.config)
        finally:
            model.train(was_training)
        if trainer.is_global_zero:
            self._write(step, result, trainer)
        return result

    def _write(self, step: int, result: WorldEvalResult, trainer: L.Trainer) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        (self.dirpath / f"step{step:06d}.json").write_text(json.dumps(
            {"step": step, "metrics": result.metrics, "answers": _plain(result.answers)}, indent=1) + "\n")
        if result.grid is not None:
            save_png(result.grid, self.dirpath / f"step{step:06d}.png")
        scalars = {f"eval/{k}": v for k, v in result.metrics.items()}
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
            experiment = getattr(logger, "experiment", None)
            if result.grid is not None and hasattr(experiment, "add_image"):
                experiment.add_image("eval/samples", result.grid, global_step=step)


def _plain(answers: dict[str, list]) -> dict[str, list]:
    return {k: [a.tolist() if isinstance(a, torch.Tensor) else a for a in v] for k, v in answers.items()}
