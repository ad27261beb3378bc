"""Read the weights of a Lightning distributed (DCP) checkpoint, which stores global tensors, into a plain,
unsharded model in one process."""

from __future__ import annotations

from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn


def load_dcp_weights(model: nn.Module, path: str | Path, prefix: str = "model.") -> nn.Module:
    """Fill `model`'s persistent tensors in place from DCP directory `path` (`state_dict`, under `prefix`)."""
    state = {f"{prefix}{key}": tensor for key, tensor in model.state_dict().items()}
    dcp.load({"state_dict": state}, checkpoint_id=str(path))
    return model
