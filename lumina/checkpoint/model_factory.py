"""`build_model`: a LuminaModel, freshly initialised or loaded from an HF checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lumina.checkpoint.load import load_hf_state_dict_into, materialise_leftovers
from lumina.model.config import LuminaConfig


def build_model(config: LuminaConfig, init_from: str | Path | None = None, meta_init: bool = False,
                device: torch.device | str = "cpu") -> nn.Module:
    """init_from: an HF directory streamed into a model built on meta; meta_init: initialised after meta."""
    from lumina.model import LuminaModel

    if init_from is not None:
        with torch.device("meta"):
            model = LuminaModel(config)
        load_hf_state_dict_into(model, init_from, dtype=torch.get_default_dtype(), device=device)
        materialise_leftovers(model, device)
        return model
    if meta_init:
        with torch.device("meta"):
            model = LuminaModel(config)
        model.to_empty(device=device)
        model.init_weights()
        return model
    return LuminaModel(config)
