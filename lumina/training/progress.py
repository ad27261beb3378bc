"""`StepProgressBar`: the rich progress bar counted in optimizer steps out of `trainer.max_steps`
("step 37/120", across epochs and resumes) instead of batches per epoch; without max_steps, Lightning's."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    def _counts_steps(self) -> bool:
        max_steps = self.trainer.max_steps
        return max_steps is not None and max_steps > 0

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self._counts_steps() else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        if not self._counts_steps():
            return super()._get_train_description(current_epoch)
        return f"{'step':{len(self.validation_description)}}"  # padded like Lightning's, against flicker

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)  # (re)sets the bar to 0 of max_steps
        if self._counts_steps():
            self._update(self.train_progress_bar_id, trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._counts_steps():
            self._update(self.train_progress_bar_id, trainer.global_step)
            self.refresh()
