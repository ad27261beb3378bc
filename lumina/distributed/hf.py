"""HF checkpoints and a sharded model: load straight into the local shards, export consolidated weights.

`load_hf_sharded` reads only the slice of each tensor this rank holds, so a sharded model never holds a full
copy; `full_state_dict` gathers the consolidated weights (what the HF export writes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from lumina.checkpoint.reader import HFCheckpoint
from lumina.checkpoint.tensor_match import Whole, match_checkpoint


def _local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(the local data to fill, its global index box) of a plain tensor or DTensor."""
    if not isinstance(tensor, DTensor):
        return tensor.data, tuple(slice(0, n) for n in tensor.shape)
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tensor.to_local()
    if tuple(local.shape) != tuple(shape):
        raise RuntimeError(f"local shard {list(local.shape)} disagrees with the computed box {list(shape)}")
    return local, tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


@torch.no_grad()
def load_hf_sharded(model: nn.Module, path: str | Path, adapter: Collection[str] = ()) -> nn.Module:
    """Fill every persistent tensor of a (sharded or plain) model from HF directory `path` (any expert
    layout), cast to each tensor's dtype, except the parameters named in `adapter` (an adapter's, which an HF
    base checkpoint does not hold; they keep their init). Key/shape problems raise CheckpointMismatchError
    before any read."""
    checkpoint = HFCheckpoint(path)
    skip = set(adapter)
    state = {key: value for key, value in model.state_dict().items() if key not in skip}
    expected = {key: tuple(t.shape) for key, t in state.items()}
    sources = match_checkpoint(checkpoint.tensors, expected, where=str(path))
    reads: dict[Path, list[tuple[str, torch.Tensor, tuple[slice, ...], int | None]]] = defaultdict(list)
    for key, source in sources.items():
        local, box = _local_box(state[key])
        if isinstance(source, Whole):
            reads[source.info.file].append((source.key, local, box, None))
            continue
        experts = box[0]
        for e in range(experts.start, experts.stop):  # only the split tensors of the local experts
            reads[source.infos[e].file].append((source.keys[e], local, box[1:], e - experts.start))
    for file in checkpoint.files:
        if reads[file]:
            with safe_open(file, framework="pt") as handle:
                for key, local, box, row in reads[file]:
                    value = handle.get_slice(key)[box]
                    (local if row is None else local[row]).copy_(value)
    return model


def full_state_dict(model: nn.Module, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The consolidated state dict on CPU (a collective): rank 0 only (others: {}) unless `all_ranks`."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)
    state = get_model_state_dict(model, options=options)
    # copies: unsharded tensors (buffers such as expert_bias) come back as the live tensors themselves
    return {key: value.detach().to("cpu", copy=True) for key, value in state.items()}
