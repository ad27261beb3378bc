"""Helpers shared by the sampler tests (a helper module, not conftest: `from conftest import` resolves to
whichever conftest pytest imported first when several test folders are given)."""

from __future__ import annotations

import copy


def record_backbone_packs(model) -> list:
    """Wrap `model.backbone` so every pack it sees is copied into the returned list (the sampler updates its
    pack in place between steps); `del model.backbone` restores the real one."""
    seen = []
    real_backbone = model.backbone

    def recording_backbone(batch):
        seen.append(copy.deepcopy(batch))
        return real_backbone(batch)

    model.backbone = recording_backbone
    return seen
