"""Official media token files: `torch.save` dicts of "indices" [N, C] and "coords" [N, k], read and written.

Reading (`read_token_file`) follows the official reader (InternLumina-U2 `utils/media_token_io.py`):
    * `torch.load(weights_only=True)`, never plain pickle: torch's allow-list plus the NumPy globals an array
      needs (`NUMPY_GLOBALS`); a pickle asking for anything else is refused (`TokenFileError`), nothing runs;
    * the schema of `_validate_media_token_schema`: "indices" and "coords", rectangular integer matrices with
      equal row counts (at least one); indices with C columns and codes in [0, K); coords non-negative, with
      the columns of its kind (image 4 or 5, video 5, mesh3d 3 or 5);
    * coords -> grid, as the official loaders read them:
        image   (batch, time, row, col[, 0])   column 2 = row, column 3 = column;  grid (h, w)
        video   (batch, t, x, y, z)            column 1 = t, 2 = x (width), 3 = y; grid (t, h, w)
        mesh3d  (x, y, z) or (batch, t, x, y, z)                                  grid (z, y, x)
      Image tokens must be in row-major order already; video and 3-D tokens are sorted into (t, y, x) /
      (z, y, x) order (as `add_break_line_multi_codebook_3d`). Every cell appears exactly once; the other
      columns are constant (one medium per file).
Optional "image_width" / "image_height" (written by `tools/tokenize_image.py` and `token_file_dict`) must be
positive integers. Every error names the file and the field.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lumina.files.fs import read_bytes

ATOKEN_CODES = (8, 4096)  # (num_codebooks C, codebook_size K) of the official AToken files
COORD_COLUMNS = {"image": (4, 5), "video": (5,), "mesh3d": (3, 5)}
# per kind and coords width: the column of each grid axis, in grid order
GRID_AXES: dict[str, dict[int, tuple[int, ...]]] = {
    "image": {4: (2, 3), 5: (2, 3)},   # (row, col)
    "video": {5: (1, 3, 2)},           # (t, y, x)
    "mesh3d": {3: (2, 1, 0), 5: (4, 3, 2)},  # (z, y, x)
}
SIZE_KEYS = ("image_height", "image_width")


def _numpy_globals() -> list[Any]:
    """The NumPy objects a pickled ndarray / scalar refers to, under NumPy 1's and 2's names."""
    core = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    found: list[Any] = [np.ndarray, np.dtype]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        found += [(core._reconstruct, f"{module}._reconstruct"), (core.scalar, f"{module}.scalar")]
    found += [type(np.dtype(t)) for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                          "uint64", "float16", "float32", "float64")]
    return found


NUMPY_GLOBALS = _numpy_globals()


class TokenFileError(ValueError):
    """A token file that cannot be read or breaks the schema; the message names the file and the field."""


@dataclass(frozen=True)
class TokenFile:
    """codes [N, C] int64 in grid order (module docstring); image_size (height, width) px when recorded."""

    kind: str
    codes: torch.Tensor
    grid: tuple[int, ...]
    image_size: tuple[int, int] | None = None


def load_token_dict(path: str | Path) -> Any:
    """The safely unpickled payload of a token file (a local path or a URL, read with the store's retries);
    TokenFileError naming the file when it is missing, corrupt or asks for another global."""
    try:
        data = read_bytes(path)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise TokenFileError(f"token file {path} does not exist") from exc
    try:
        with torch.serialization.safe_globals(NUMPY_GLOBALS):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickler refusal or a corrupt file; nothing of the pickle ran
        raise TokenFileError(f"token file {path} cannot be read safely (torch.load weights_only=True, torch's "
                             f"allow-list plus NumPy arrays): {_refusal(data, exc)}") from exc


def _refusal(data: bytes, exc: Exception) -> str:
    """The globals a refused pickle asks for beyond NUMPY_GLOBALS, else the loader's own reason."""
    allowed = {g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}" for g in NUMPY_GLOBALS}
    try:
        foreign = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
                   if g not in allowed]
    except Exception:  # not a zip checkpoint: report what torch.load said
        foreign = []
    if foreign:
        return f"its pickle asks for {foreign}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def _matrix(value: Any, path: str | Path, kind: str, name: str, columns: tuple[int, ...]) -> torch.Tensor:
    where = f"token file {path}: {kind} {name}"
    try:
        matrix = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TokenFileError(f"{where} must be a rectangular integer matrix, got {type(value).__name__}") from exc
    if matrix.dim() != 2:
        raise TokenFileError(f"{where} must be 2-D, got shape {list(matrix.shape)}")
    if matrix.shape[0] == 0:
        raise TokenFileError(f"{where} must hold at least one row, got shape {list(matrix.shape)}")
    if matrix.shape[1] not in columns:
        expected = " or ".join(map(str, columns))
        raise TokenFileError(f"{where} must have {expected} columns, got shape {list(matrix.shape)}")
    if matrix.dtype == torch.bool or matrix.dtype.is_floating_point or matrix.dtype.is_complex:
        raise TokenFileError(f"{where} must have an integer dtype, got {matrix.dtype}")
    return matrix.long()


def _image_size(data: dict, path: str | Path) -> tuple[int, int] | None:
    given = [k for k in SIZE_KEYS if k in data]
    if not given:
        return None
    if len(given) != 2:
        raise TokenFileError(f"token file {path}: {given[0]} given without {set(SIZE_KEYS) - set(given)}")
    size = []
    for key in SIZE_KEYS:
        value = data[key]
        value = value.item() if isinstance(value, torch.Tensor | np.ndarray) and value.size == 1 else value
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
            raise TokenFileError(f"token file {path}: {key}={value!r} must be a positive integer")
        size.append(int(value))
    return size[0], size[1]


def grid_order(coords: torch.Tensor, kind: str, where: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(permutation into grid order, grid) of validated coords; TokenFileError naming `where` unless every
    cell appears exactly once (images: already row-major)."""
    axes = GRID_AXES[kind][coords.shape[1]]
    grid = tuple(int(coords[:, a].max()) + 1 for a in axes)
    n = coords.shape[0]
    if n != math.prod(grid):
        raise TokenFileError(f"{where}: coords has {n} rows but spans the grid {grid} ({math.prod(grid)} cells)")
    flat = torch.zeros(n, dtype=torch.long)
    for axis, size in zip(axes, grid, strict=True):
        flat = flat * size + coords[:, axis]
    others = [c for c in range(coords.shape[1]) if c not in axes]
    for c in others:
        if (coords[:, c] != coords[0, c]).any():
            raise TokenFileError(f"{where}: coords column {c} varies; one file holds one {kind}")
    if kind == "image":
        wrong = (flat != torch.arange(n)).nonzero()
        if len(wrong):
            i = int(wrong[0])
            raise TokenFileError(f"{where}: coords are not in row-major order of grid {grid} (the official "
                                 f"reader takes image tokens in file order): row {i} is {coords[i].tolist()}")
        return torch.arange(n), grid
    order = flat.argsort()
    if not torch.equal(flat[order], torch.arange(n)):
        raise TokenFileError(f"{where}: coords do not cover the grid {grid} exactly once")
    return order, grid


def validate_token_dict(data: Any, path: str | Path, kind: str, num_codebooks: int = ATOKEN_CODES[0],
                        codebook_size: int = ATOKEN_CODES[1]) -> TokenFile:
    """A loaded payload -> TokenFile (module docstring); TokenFileError naming `path` and the field."""
    if kind not in COORD_COLUMNS:
        raise TokenFileError(f"token file {path}: kind={kind!r}, expected one of {sorted(COORD_COLUMNS)}")
    if not isinstance(data, dict):
        raise TokenFileError(f"token file {path}: the payload must be a dict, got {type(data).__name__}")
    missing = sorted({"indices", "coords"} - data.keys())
    if missing:
        raise TokenFileError(f"token file {path}: missing key(s) {missing}; found {sorted(map(str, data))}")
    indices = _matrix(data["indices"], path, kind, "indices", (num_codebooks,))
    coords = _matrix(data["coords"], path, kind, "coords", COORD_COLUMNS[kind])
    if indices.shape[0] != coords.shape[0]:
        raise TokenFileError(f"token file {path}: {kind} indices has {indices.shape[0]} rows, coords has "
                             f"{coords.shape[0]}; they must match")
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= codebook_size:
        raise TokenFileError(f"token file {path}: {kind} indices must lie in [0, {codebook_size}), got min={low}, "
                             f"max={high}")
    if int(coords.min()) < 0:
        raise TokenFileError(f"token file {path}: {kind} coords must be non-negative, got min={int(coords.min())}")
    order, grid = grid_order(coords, kind, f"token file {path}")
    return TokenFile(kind, indices[order], grid, _image_size(data, path))


def read_token_file(path: str | Path, kind: str, num_codebooks: int = ATOKEN_CODES[0],
                    codebook_size: int = ATOKEN_CODES[1]) -> TokenFile:
    """An official `.pkl` / `.pt` token file (a local path or a URL) -> TokenFile."""
    return validate_token_dict(load_token_dict(path), path, kind, num_codebooks, codebook_size)


def image_coords(grid: tuple[int, int]) -> torch.Tensor:
    """int32 [h * w, 5] (0, 0, row, col, 0) in row-major order: an image's coords as the official tool writes."""
    h, w = grid
    rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    zeros = torch.zeros(h * w, dtype=torch.long)
    return torch.stack([zeros, zeros, rows, cols, zeros], dim=1).int()


def token_file_dict(codes: torch.Tensor, grid: tuple[int, int], image_size: tuple[int, int] | None = None
                    ) -> dict[str, Any]:
    """An image's token file as `tools/tokenize_image.py` writes it (image_size: (height, width) or None)."""
    if codes.dim() != 2 or codes.shape[0] != math.prod(grid):
        raise ValueError(f"codes has shape {list(codes.shape)}; expected [{math.prod(grid)}, C] for grid {grid}")
    doc: dict[str, Any] = {"indices": codes.to(torch.int32).cpu(), "coords": image_coords(grid)}
    if image_size is not None:
        doc["image_width"], doc["image_height"] = int(image_size[1]), int(image_size[0])
    return doc
