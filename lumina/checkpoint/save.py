"""Export a model (or a fused-layout state dict) as an HF checkpoint directory the official release loads."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from lumina.checkpoint.keys import LAYOUTS, MODEL_TYPE_OF_LAYOUT, official_buffer_dtype, official_shapes
from lumina.checkpoint.official_parts import check_official_parts
from lumina.checkpoint.tensor_match import CheckpointMismatchError
from lumina.checkpoint.writer import export_plan, parse_size, prepare_directory, write_shards
from lumina.model.config import LuminaConfig
from lumina.model.dtypes import float_dtype

# Files beside the weights that the official loader / tokenizer need; copied from a source directory.
ASSET_PATTERNS = ("*.py", "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                  "*.tiktoken", "chat_template*", "generation_config.json", "preprocessor_config.json")


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """None / "keep" -> None (keep every tensor's dtype); else a name of FLOAT_DTYPES (or a torch dtype)."""
    if dtype is None or dtype == "keep":
        return None
    return float_dtype("dtype", dtype)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the config.json `torch_dtype` spelling)."""
    return str(dtype).removeprefix("torch.")


def copy_assets(source_dir: str | Path, directory: str | Path) -> list[Path]:
    """Copy tokenizer files and `*.py` (ASSET_PATTERNS, top level only) from `source_dir` into `directory`."""
    source_dir, directory = Path(source_dir), Path(directory)
    if not source_dir.is_dir():
        raise FileNotFoundError(f"source_dir {str(source_dir)!r} is not a directory")
    if source_dir.resolve() == directory.resolve():
        return []  # exporting into the source directory: the files are already there
    copied = []
    for path in sorted(source_dir.iterdir()):
        if path.is_file() and any(path.match(pattern) for pattern in ASSET_PATTERNS):
            copied.append(Path(shutil.copy2(path, directory / path.name)))
    return copied


def check_state_dict(state: Mapping[str, torch.Tensor], config: LuminaConfig) -> None:
    """Raise CheckpointMismatchError unless `state` holds exactly the official fused-layout keys and shapes."""
    expected = official_shapes(config, "fused")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mis_shaped = [f"{k}: state dict {list(state[k].shape)}, expected {list(expected[k])}"
                  for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError("state dict to save", missing, unexpected, mis_shaped, [])
    on_meta = [k for k, t in state.items() if t.is_meta]
    if on_meta:
        raise ValueError(f"cannot save tensors on the meta device (they hold no data): {', '.join(on_meta)}")


def save_pretrained(model: nn.Module | Mapping[str, torch.Tensor], directory: str | Path, *,
                    config: LuminaConfig | None = None, layout: str = "split",
                    dtype: torch.dtype | str | None = None, max_shard_size: int | str = "5GB",
                    source_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write `model` (a LuminaModel, or its fused-layout state dict plus `config`) to `directory` in `layout`
    ("split": what the official loader accepts, or "fused"). dtype None keeps tensors bit-exact; a dtype casts
    parameters only. Tokenizer and `*.py` files of `source_dir` are copied beside the weights."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {LAYOUTS}")
    out_dtype, shard_bytes = resolve_dtype(dtype), parse_size(max_shard_size)  # bad arguments fail before writing
    if source_dir is not None and not Path(source_dir).is_dir():
        raise FileNotFoundError(f"source_dir {str(source_dir)!r} is not a directory")
    if isinstance(model, nn.Module):
        state = model.state_dict()
        config = config if config is not None else model.config
    else:
        state = dict(model)
        if config is None:
            raise ValueError("config is required when saving a state dict")
    check_official_parts(config, layout)
    check_state_dict(state, config)
    plan = export_plan(((k, tuple(t.shape), t.dtype) for k, t in state.items()),
                       lambda key, e: state[key] if e is None else state[key][e], layout, out_dtype)
    directory = prepare_directory(directory, overwrite)
    write_shards(directory, plan, shard_bytes)
    param_dtypes = {t.dtype for k, t in state.items() if official_buffer_dtype(k) is None}
    torch_dtype = out_dtype or (param_dtypes.pop() if len(param_dtypes) == 1 else None)
    changes = {"model_type": MODEL_TYPE_OF_LAYOUT[layout]}
    if torch_dtype is not None:
        changes["torch_dtype"] = dtype_name(torch_dtype)
    config.save_hf(directory, **changes)
    if source_dir is not None:
        copy_assets(source_dir, directory)
    return directory
