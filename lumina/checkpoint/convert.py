"""Convert an HF checkpoint directory between the split and fused expert layouts (and optionally dtype),
streaming from memory-mapped source shards so that memory holds one output shard."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from lumina.checkpoint.keys import LAYOUTS, MODEL_TYPE_OF_LAYOUT, official_shapes
from lumina.checkpoint.reader import HFCheckpoint, open_shard
from lumina.checkpoint.save import copy_assets, dtype_name, resolve_dtype
from lumina.checkpoint.tensor_match import Source, Whole, match_checkpoint
from lumina.checkpoint.writer import export_plan, parse_size, write_shards
from lumina.files.outputs import check_output, staged_output


def convert_checkpoint(src: str | Path, dst: str | Path, *, layout: str = "split",
                       dtype: torch.dtype | str | None = None, max_shard_size: int | str = "5GB",
                       overwrite: bool = False) -> Path:
    """Rewrite checkpoint `src` (any expert layout, checked against its config.json) as `layout` in `dst`,
    with config.json, tokenizer files and `*.py`; dtype None keeps tensors bit-exact. `dst` is written as a
    `lumina.files.outputs` output: a non-empty one is refused unless `overwrite`; it appears once complete."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {LAYOUTS}")
    out_dtype, shard_bytes = resolve_dtype(dtype), parse_size(max_shard_size)  # bad arguments fail before writing
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"dst={str(dst)!r} is the source directory; convert into a new directory")
    check_output(dst, overwrite, [src])
    checkpoint = HFCheckpoint(src)
    config = checkpoint.config()
    expected = official_shapes(config, "fused")
    sources = match_checkpoint(checkpoint.tensors, expected, where=str(src))
    entries = [(key, shape, _source_dtype(sources[key])) for key, shape in expected.items()]
    with staged_output(dst, overwrite, [src]) as directory:
        _write(directory, src, config, sources, expected, entries, layout, out_dtype, shard_bytes)
    return dst


def _write(directory: Path, src: Path, config, sources: dict, expected: dict, entries: list, layout: str,
           out_dtype: torch.dtype | None, shard_bytes: int) -> None:
    files = _OpenFiles()
    try:
        def fetch(key: str, expert: int | None) -> torch.Tensor:
            source = sources[key]
            if isinstance(source, Whole):
                opened = files(source.info.file)
                return opened.get_tensor(source.key) if expert is None else opened.get_slice(source.key)[expert]
            if expert is not None:
                return files(source.infos[expert].file).get_tensor(source.keys[expert])
            fused = torch.empty(expected[key], dtype=source.infos[0].dtype)
            for e, (split_key, info) in enumerate(zip(source.keys, source.infos, strict=True)):
                fused[e].copy_(files(info.file).get_tensor(split_key))
            return fused

        write_shards(directory, export_plan(entries, fetch, layout, out_dtype), shard_bytes, after_shard=files.close)
    finally:
        files.close()
    changes = {"model_type": MODEL_TYPE_OF_LAYOUT[layout]}
    if out_dtype is not None:
        changes["torch_dtype"] = dtype_name(out_dtype)
    config.save_hf(directory, **changes)
    copy_assets(src, directory)


class _OpenFiles:
    """safe_open handles, opened on demand and closed after each written shard (their pages stay resident)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __call__(self, file: Path) -> Any:
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(open_shard(file))
        return self._handles[file]

    def close(self) -> None:
        self._stack.close()
        self._stack, self._handles = ExitStack(), {}


def _source_dtype(source: Source) -> torch.dtype:
    return source.info.dtype if isinstance(source, Whole) else source.infos[0].dtype

