"""`HFCheckpoint`: the tensor headers of an HF checkpoint directory (`config.json` and one `model.safetensors`
or shards listed by `model.safetensors.index.json`), read without loading any weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from lumina.model.config import LuminaConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


@contextmanager
def open_shard(file: Path) -> Iterator[Any]:
    """`safe_open` of one weight file; a truncated or corrupt file raises ValueError naming it."""
    try:
        with safe_open(file, framework="pt") as handle:
            yield handle
    except SafetensorError as error:
        raise ValueError(f"weight file {str(file)!r} is truncated or corrupt: {error}") from error


@dataclass(frozen=True)
class TensorInfo:
    """Where one checkpoint tensor lives and what it is, from the safetensors header."""

    file: Path
    shape: tuple[int, ...]
    dtype: torch.dtype


class HFCheckpoint:
    """`tensors`: key -> TensorInfo; `files`: weight files in index order; inconsistency: ValueError."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"checkpoint directory {str(self.directory)!r} does not exist")
        single, index = self.directory / SINGLE_FILE, self.directory / INDEX_FILE
        if single.exists() and index.exists():
            raise ValueError(f"{self.directory} holds both {SINGLE_FILE} and {INDEX_FILE}; keep one of them")
        if index.exists():
            try:
                self.index: dict[str, Any] | None = json.loads(index.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"{str(index)!r} is not valid JSON: {error}") from error
            weight_map = self.index.get("weight_map") if isinstance(self.index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: 'weight_map' is missing or empty")
            self.files = [self.directory / name for name in dict.fromkeys(weight_map.values())]
        elif single.exists():
            self.index, weight_map = None, None
            self.files = [single]
        else:
            raise FileNotFoundError(f"{self.directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
        self.tensors = self._read_headers(weight_map)

    def _read_headers(self, weight_map: dict[str, str] | None) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        problems: list[str] = []
        for file in self.files:
            if not file.exists():
                problems.append(f"shard {file.name!r} named by {INDEX_FILE} does not exist")
                continue
            with open_shard(file) as handle:
                for key in handle.keys():
                    view = handle.get_slice(key)
                    dtype_name = view.get_dtype()
                    if dtype_name not in SAFETENSORS_DTYPES:
                        problems.append(f"{key!r} in {file.name} has unsupported dtype {dtype_name}")
                        continue
                    if key in tensors:
                        problems.append(f"{key!r} is stored twice: in {tensors[key].file.name} and {file.name}")
                        continue
                    if weight_map is not None and weight_map.get(key) != file.name:
                        problems.append(f"{key!r} is stored in {file.name} but {INDEX_FILE} maps it to "
                                        f"{weight_map.get(key)!r}")
                    tensors[key] = TensorInfo(file, tuple(view.get_shape()), SAFETENSORS_DTYPES[dtype_name])
        if weight_map is not None:
            problems += [f"{key!r} is listed in {INDEX_FILE} (shard {name!r}) but not stored there"
                         for key, name in weight_map.items() if key not in tensors
                         and (self.directory / name).exists()]
        if problems:
            raise ValueError(f"{self.directory}: inconsistent checkpoint:\n  " + "\n  ".join(problems))
        return tensors

    def config(self, **overrides: Any) -> LuminaConfig:
        """`LuminaConfig.from_hf` of the directory's config.json."""
        path = self.directory / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"{self.directory} has no config.json")
        return LuminaConfig.from_hf(path, **overrides)
