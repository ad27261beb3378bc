"""Read the weights of a Lightning distributed (DCP) checkpoint, which stores global tensors, into a plain,
unsharded model in one process."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn


def load_dcp_weights(model: nn.Module, path: str | Path, prefix: str = "model.",
                     keys: Collection[str] | None = None) -> nn.Module:
    """Fill `model`'s persistent tensors in place from DCP directory `path` (`state_dict`, under `prefix`):
    all of them, or those named in `keys` (an adapter's, from a checkpoint that holds no frozen base). A
    tensor the checkpoint lacks is an error."""
    wanted = model.state_dict()
    unknown = sorted(set(keys or ()) - set(wanted))
    if unknown:
        raise ValueError(f"load_dcp_weights: keys names {unknown[0]!r}, not a tensor of the model")
    state = {f"{prefix}{key}": tensor for key, tensor in wanted.items() if keys is None or key in keys}
    dcp.load({"state_dict": state}, checkpoint_id=str(path))
    return model
