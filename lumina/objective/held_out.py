"""The one held-out loss: packs scored one by one, each pack's objective loss weighted by its scored targets."""

from __future__ import annotations

import torch

from lumina.objective.result import ObjectiveResult


def scored_targets(result: ObjectiveResult) -> int:
    """The targets a pack's loss averages: text answer tokens + image cells x codebooks."""
    return result.text_targets.numel() + result.image_targets.numel()


class HeldOutLoss:
    """Sums over packs -> `scores()`: loss and answer accuracy weighted by `scored_targets`, each codebook's loss
    by its image cells (validation, the conditioning check and `lumina-generate task=eval` report these)."""

    def __init__(self, num_codebooks: int) -> None:
        self.loss = self.right = self.count = self.cells = 0.0
        self.codebooks = torch.zeros(num_codebooks, dtype=torch.float64)

    def add(self, result: ObjectiveResult) -> None:
        n = scored_targets(result)
        self.loss += float(result.loss) * n
        self.right += float((result.text_preds == result.text_targets).sum() +
                            (result.image_preds == result.image_targets).sum())
        self.count += n
        self.codebooks += result.image_loss_per_codebook.double().cpu() * result.image_targets.shape[0]
        self.cells += result.image_targets.shape[0]

    def scores(self) -> tuple[float, float, list[float]]:
        """(loss, accuracy, loss per codebook [C], empty without image answers)."""
        count = max(self.count, 1)
        return self.loss / count, self.right / count, (self.codebooks / self.cells).tolist() if self.cells else []
