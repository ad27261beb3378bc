"""Output directories that are never overwritten or mixed: `lumina-data build / world / fit-tokenizer` and
`lumina-convert` write through `staged_output`.

A non-empty output directory is refused (`OutputError`, naming what it holds) unless `overwrite=True`; then
the old directory is replaced as a whole, so no stale shard or report of an earlier run stays beside the new
ones. The command writes into a temporary directory beside the output (`.NAME.partial-PID`), renamed into
place only when the command finishes: an interrupted run (even `kill -9`) leaves no half-written output under
the name, only that temporary directory, which the next run names and removes with `overwrite=True`.
An output that is a file, or that holds one of the command's inputs, is refused even with `overwrite=True`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

PARTIAL = ".partial-"  # the temporary directory of output NAME is .NAME.partial-PID


class OutputError(ValueError):
    """An output directory that cannot be written without losing or mixing data; the message names it."""


def _listing(directory: Path, limit: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    return ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")


def leftovers(out: Path) -> list[Path]:
    """Temporary directories interrupted runs left beside `out`."""
    return sorted(out.parent.glob(f".{out.name}{PARTIAL}*")) if out.parent.is_dir() else []


def check_output(out: str | Path, overwrite: bool, inputs: Iterable[str | Path] = ()) -> Path:
    """`out` as a Path, refused (OutputError) when it cannot be written (module docstring); leftovers of
    interrupted runs are removed when `overwrite`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} is an existing file; name a directory")
    resolved = out.resolve()
    for item in inputs:
        if (isinstance(item, str) and "://" in item) or not Path(item).exists():  # a URL, or a name (builtin)
            continue
        path = Path(item).resolve()
        if path == resolved or resolved in path.parents:
            raise OutputError(f"output {out} holds the input {item}; write the output elsewhere")
    for left in leftovers(out):
        if not overwrite:
            raise OutputError(f"{left} is left from an interrupted run writing {out}; pass --overwrite to remove it")
        shutil.rmtree(left)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputError(f"output {out} is not empty (it holds {_listing(out)}); pass --overwrite to replace it, "
                          "or name a new directory")
    return out


@contextmanager
def staged_output(out: str | Path, overwrite: bool, inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Yields a fresh temporary directory beside `out`; when the block finishes it replaces `out` (an error in
    the block removes it and leaves `out` as it was)."""
    out = check_output(out, overwrite, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}{PARTIAL}{os.getpid()}"
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():  # empty, or overwrite=True: set the old one aside first, so `out` is never half-written
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        stage.rename(out)
        shutil.rmtree(old)
    else:
        stage.rename(out)
