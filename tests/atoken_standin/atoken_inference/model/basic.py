"""Stand-in `SparseTensor` (official: atoken_inference/model/basic.py): `.feats` [N, D] and `.coords` [N, 5]."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SparseTensor:
    feats: torch.Tensor
    coords: torch.Tensor

    def cpu(self) -> SparseTensor:
        return SparseTensor(self.feats.cpu(), self.coords.cpu())
