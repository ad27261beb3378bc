"""Write an export plan (`PlannedTensor`s) as sharded safetensors + `model.safetensors.index.json`. Shards
are assigned from shapes alone, so only one shard's tensors are in memory at a time."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import save_file

from lumina.checkpoint.keys import (
    LAYOUTS,
    expert_group,
    is_fused_expert_key,
    official_buffer_dtype,
    split_expert_key,
)
from lumina.checkpoint.reader import INDEX_FILE, SINGLE_FILE

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of an export: `load()` returns it (any dtype/device); the writer casts it to `dtype`."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def parse_size(size: int | str) -> int:
    """Bytes from 12345, "5GB" (10^9), "500MiB" (2^20), ... Must be positive."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"max_shard_size={size!r}: expected bytes or a size like '5GB', '500MB', '2GiB'")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise ValueError(f"max_shard_size={size!r}: must be positive")
    return value


def export_dtype(model_key: str, source: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """dtype=None keeps `source`; else parameters become `dtype`, persistent buffers their official dtype."""
    if dtype is None:
        return source
    return official_buffer_dtype(model_key) or dtype


def export_plan(entries: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
                fetch: Callable[[str, int | None], torch.Tensor], layout: str,
                dtype: torch.dtype | None) -> list[PlannedTensor]:
    """Plan fused-layout tensors `entries` (key, shape, dtype) for `layout` (split: expert-major order).
    `fetch(key, None)` returns the whole tensor, `fetch(key, e)` slice e of a fused expert tensor."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {LAYOUTS}")
    entries = list(entries)
    groups: dict[str, list[tuple[str, tuple[int, ...], torch.dtype]]] = {}
    for entry in entries:
        if is_fused_expert_key(entry[0]):
            groups.setdefault(expert_group(entry[0]), []).append(entry)
    plan: list[PlannedTensor] = []
    for key, shape, source_dtype in entries:
        out_dtype = export_dtype(key, source_dtype, dtype)
        if layout == "fused" or not is_fused_expert_key(key):
            plan.append(PlannedTensor(key, tuple(shape), out_dtype, partial(fetch, key, None)))
            continue
        group = groups.pop(expert_group(key), None)
        if group is None:  # already emitted with the first key of its layer
            continue
        num_experts = group[0][1][0]
        for member_key, member_shape, _ in group:
            if member_shape[0] != num_experts:
                raise ValueError(f"{member_key} has {member_shape[0]} experts, {group[0][0]} has {num_experts}")
        for e in range(num_experts):
            for member_key, member_shape, member_dtype in group:
                plan.append(PlannedTensor(split_expert_key(member_key, e), tuple(member_shape[1:]),
                                          export_dtype(member_key, member_dtype, dtype),
                                          partial(fetch, member_key, e)))
    return plan


def assign_shards(plan: list[PlannedTensor], max_shard_size: int) -> list[list[PlannedTensor]]:
    """Fill shards in plan order, a new one when the next tensor would pass `max_shard_size`."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for item in plan:
        if shards[-1] and size + item.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item.nbytes
    return shards


def prepare_directory(directory: str | Path, overwrite: bool) -> Path:
    """Create `directory`; refuse (or with overwrite=True remove) weight files a previous export left."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    old = [p for p in directory.iterdir() if p.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_RE.match(p.name)]
    if old and not overwrite:
        raise FileExistsError(f"{directory} already holds weights ({', '.join(sorted(p.name for p in old))}); "
                              f"pass overwrite=True to replace them")
    for path in old:
        path.unlink()
    return directory


def write_shards(directory: str | Path, plan: list[PlannedTensor], max_shard_size: int | str,
                 after_shard: Callable[[], None] | None = None) -> dict:
    """Write `plan` as `model-0000i-of-0000N.safetensors` + index; `after_shard()` runs after each shard."""
    directory = Path(directory)
    if not plan:
        raise ValueError("export plan is empty: nothing to write")
    names = [p.name for p in plan]
    if len(set(names)) != len(names):
        duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
        raise ValueError(f"export plan names these tensors twice: {duplicates}")
    shards = assign_shards(plan, parse_size(max_shard_size))
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {item.name: _produce(item) for item in shard}
        weight_map.update(dict.fromkeys(tensors, file_name))
        save_file(tensors, directory / file_name, metadata={"format": "pt"})
        del tensors
        if after_shard is not None:
            after_shard()
    index = {"metadata": {"total_size": sum(p.nbytes for p in plan)},
             "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return index


def _produce(item: PlannedTensor) -> torch.Tensor:
    """The planned tensor, checked against its planned shape, as a contiguous CPU tensor of the planned dtype."""
    tensor = item.load().detach()
    if tuple(tensor.shape) != item.shape:
        raise ValueError(f"{item.name}: produced shape {list(tensor.shape)}, planned {list(item.shape)}")
    return tensor.to(device="cpu", dtype=item.dtype).contiguous()
