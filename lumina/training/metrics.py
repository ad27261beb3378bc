"""Token accuracies as torchmetrics, micro-averaged, synchronised over the data-parallel process group."""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy


def token_accuracy(num_classes: int) -> MulticlassAccuracy:
    # average="micro": the share of correctly predicted tokens, not a mean over classes.
    return MulticlassAccuracy(num_classes=num_classes, average="micro", top_k=1, validate_args=False)


class TokenAccuracies(nn.Module):
    """text: accuracy of the text answer tokens; codebooks[c]: accuracy of image codebook c."""

    def __init__(self, vocab_size: int, codebook_size: int, num_codebooks: int) -> None:
        super().__init__()
        self.text = token_accuracy(vocab_size)
        self.codebooks = nn.ModuleList(token_accuracy(codebook_size) for _ in range(num_codebooks))

    def set_process_group(self, group) -> None:
        """Use `group` (the data-parallel group; None = the default group) for the sync in `compute`."""
        for metric in (self.text, *self.codebooks):
            metric.process_group = group

    @torch.no_grad()
    def update(self, text_preds: torch.Tensor, text_targets: torch.Tensor,
               image_preds: torch.Tensor, image_targets: torch.Tensor) -> None:
        """text_preds/targets [Nt]; image_preds/targets [Ni, C]."""
        if text_preds.numel():  # torchmetrics cannot reshape an empty batch; it adds nothing anyway
            self.text.update(text_preds, text_targets)
        if image_preds.numel():
            for c, metric in enumerate(self.codebooks):
                metric.update(image_preds[:, c], image_targets[:, c])

    def compute(self) -> dict[str, torch.Tensor]:
        """Every accuracy (a collective: a metric no rank updated reads 0; callers drop it by token count)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
            out = {"text_acc": self.text.compute()}
            out.update({f"image_acc/cb{c}": m.compute() for c, m in enumerate(self.codebooks)})
        return out

    def reset(self) -> None:
        for metric in (self.text, *self.codebooks):
            metric.reset()
