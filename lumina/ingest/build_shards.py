"""`lumina-data build`: JSONL manifests (+ official token files) -> Parquet sample shards.

Manifest: one JSON object per non-blank line, named by its file and 1-based line number:

    {"id": "s-0001",                                  required, unique across the build
     "source": "mydata",                              optional mixture source name (default: --source)
     "turns": [                                       required, non-empty, in order
       {"role": "system" | "user" | "assistant",
        "parts": [                                    required, in order
          {"kind": "text", "ids": [12, 7, 99]},      text as token ids
          {"kind": "text", "text": "a red circle"},  text as a string (needs a tokenizer)
          {"kind": "image", "path": "tok/0001.pt"},  an official token file, relative to the manifest
          {"kind": "image", "codes": [[c0, .., cC-1], ...], "grid": [h, w]},          inline codes [N, C]
          {"kind": "video", "path": "v.pt"}, {"kind": "mesh3d", "path": "m.pt", "grid": [z, y, x]}
          {"kind": "image", "file": "cats/01.png"},      an image file (PNG, JPEG, WebP), relative to the manifest
          {"kind": "video", "files": ["f0.png", ...]}    a video as its frame files, in order
        ]}]}

A manifest may be an fsspec URL (`s3://bucket/prefix/train.jsonl`; relative parts resolve against its
prefix), read through `lumina.files.fs`; a store that stays down stops the build with a StoreError naming the
URL. Image files need a visual tokenizer (`pixels`, CLI `--image-tokenizer`; `lumina.tokenizers.pixels`,
`lumina.ingest.encode`); token files are read by `lumina.tokenizers.token_files`, and a "grid" beside a "path" must
equal its coords' grid. A bad row raises `BuildError` naming the manifest file and line (and the token or
image file); with on_error="skip" it is listed in the `BuildReport` (and `build_report.json`) instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from lumina.contract.schema import GRID_RANK, Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import DatasetAssets
from lumina.data.sequence_layout import check_sample
from lumina.data.storage import ROLES, LengthFn, ShardWriter
from lumina.files.fs import is_file, is_url, join, parent, read_lines
from lumina.ingest.encode import PendingRow, PixelEncoder, PixelPart
from lumina.tokenizers.text import TextTokenizer
from lumina.tokenizers.token_files import TokenFileError, read_token_file


class BuildError(ValueError):
    """A manifest row that cannot be built; the message starts with 'file:line:'."""


@dataclass
class Skipped:
    manifest: str
    line: int
    reason: str


@dataclass
class BuildReport:
    rows_written: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    ignored_keys: dict[str, int] = field(default_factory=dict)  # key -> source lines holding it, unused

    @property
    def rows_skipped(self) -> int:
        return len(self.skipped)

    def to_json(self) -> dict[str, Any]:
        return {"rows_written": self.rows_written, "rows_skipped": self.rows_skipped, "shards": self.shards,
                "skipped": [asdict(s) for s in self.skipped], "ignored_keys": self.ignored_keys}


class _RowError(Exception):
    """Internal: a reason without the file:line prefix."""


ROW_KEYS = ("id", "source", "turns")
TURN_KEYS = ("role", "parts")
PART_KEYS = ("kind", "ids", "text", "path", "codes", "grid", "file", "files")


def _known_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    """A key the schema does not know (a misspelling) is an error, never ignored."""
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise _RowError(f"{where}: unknown key {unknown[0]!r} (expected keys among {list(allowed)})")


def _require(obj: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise _RowError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _RowError(f"{where}.{key}={value!r}: expected {getattr(kind, '__name__', kind)}")
    return value


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _RowError(f"{where}={str(value)[:80]}: expected a list of integers")
    return value


PIXEL_KEYS = {"image": "file", "video": "files"}  # the key that holds a media kind's image files


def parse_pixel_part(part: dict, kind: str, where: str, base_dir: str | Path, pixels: bool) -> PixelPart:
    """An image "file" / video "files" part -> PixelPart (files checked to exist)."""
    key = PIXEL_KEYS.get(kind)
    if key is None or key not in part:
        raise _RowError(f"{where}: a {kind} part takes " + (f"its image files as {key!r}" if key else
                                                            "no image files (a token file or codes)"))
    if not pixels:
        raise _RowError(f"{where}.{key}: image files need a visual tokenizer (pass --image-tokenizer "
                        "builtin|atoken|DIR)")
    if "grid" in part:
        raise _RowError(f"{where}.grid: the grid of image files is the visual tokenizer's; drop 'grid'")
    names = [_require(part, key, str, where)] if kind == "image" else _require(part, key, list, where)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise _RowError(f"{where}.{key}={str(names)[:80]}: expected a non-empty list of file names")
    files = tuple(join(base_dir, n) for n in names)
    for n, f in enumerate(files):
        if not is_file(f):
            at = f"{where}.{key}" + (f"[{n}]" if kind == "video" else "")
            raise _RowError(f"{at}: image file {f} does not exist")
    return PixelPart(kind, files, where)


def parse_part(part: Any, where: str, base_dir: str | Path, tokens: SpecialTokens,
               tokenizer: TextTokenizer | None, pixels: bool = False) -> Text | Media | PixelPart:
    if not isinstance(part, dict):
        raise _RowError(f"{where}={part!r}: expected an object")
    _known_keys(part, PART_KEYS, where)
    kind = _require(part, "kind", str, where)
    if kind == "text":
        if ("ids" in part) == ("text" in part):
            raise _RowError(f"{where}: a text part needs exactly one of 'ids' or 'text'")
        if "text" in part:
            text = _require(part, "text", str, where)
            if tokenizer is None:
                raise _RowError(f"{where}.text: a string needs a tokenizer (pass --tokenizer), or give 'ids'")
            try:
                ids = tokenizer.encode(text)
            except ValueError as exc:
                raise _RowError(f"{where}.text: {exc}") from exc
        else:
            ids = _int_list(part["ids"], f"{where}.ids")
        bad = [i for i in ids if not 0 <= i < tokens.text_vocab_size]
        if bad:
            raise _RowError(f"{where}.ids has values outside [0, {tokens.text_vocab_size}), e.g. {bad[:4]}")
        return Text(list(ids))
    if kind not in GRID_RANK:
        raise _RowError(f"{where}.kind={kind!r}: expected 'text' or one of {sorted(GRID_RANK)}")
    sources = [k for k in ("path", "codes", "file", "files") if k in part]
    if len(sources) != 1:
        pixels_key = f" or {PIXEL_KEYS[kind]!r}" if kind in PIXEL_KEYS else ""
        raise _RowError(f"{where}: a {kind} part needs exactly one of 'path', 'codes'{pixels_key}, got {sources}")
    if sources[0] in ("file", "files"):
        return parse_pixel_part(part, kind, where, base_dir, pixels)
    grid = tuple(_int_list(part["grid"], f"{where}.grid")) if "grid" in part else None
    if "path" in part:
        path = _require(part, "path", str, where)
        try:
            found_file = read_token_file(join(base_dir, path), kind, tokens.num_codebooks, tokens.codebook_size)
        except TokenFileError as exc:
            raise _RowError(str(exc)) from exc
        codes, found = found_file.codes, found_file.grid
        if grid is not None and grid != found:
            raise _RowError(f"{where}.grid={list(grid)} disagrees with the grid {list(found)} of token file {path}")
        grid = found
    else:
        if grid is None:
            raise _RowError(f"{where}: inline codes need a 'grid'")
        rows = part["codes"]
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise _RowError(f"{where}.codes: expected a list of [C] integer lists")
        for r, row in enumerate(rows):
            _int_list(row, f"{where}.codes[{r}]")
        if len({len(r) for r in rows}) > 1:
            raise _RowError(f"{where}.codes: rows have different lengths")
        codes = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1)
    media = Media(kind, codes, grid)
    try:
        media.validate(tokens.codebook_size, tokens.num_codebooks, where=where)
    except ValueError as exc:
        source = f" (token file {part['path']})" if "path" in part else ""
        raise _RowError(f"{exc}{source}") from exc
    return media


def parse_row(obj: Any, base_dir: str | Path, tokens: SpecialTokens, tokenizer: TextTokenizer | None,
              default_source: str, pixels: bool = False) -> Sample:
    if not isinstance(obj, dict):
        raise _RowError(f"row is {type(obj).__name__}; expected a JSON object")
    _known_keys(obj, ROW_KEYS, "row")
    sid = _require(obj, "id", str, "row")
    if not sid:
        raise _RowError("row.id is empty")
    source = _require(obj, "source", str, "row") if "source" in obj else default_source
    turns_in = _require(obj, "turns", list, "row")
    if not turns_in:
        raise _RowError("row.turns is empty")
    turns = []
    for k, turn in enumerate(turns_in):
        where = f"turns[{k}]"
        if not isinstance(turn, dict):
            raise _RowError(f"{where}={turn!r}: expected an object")
        _known_keys(turn, TURN_KEYS, where)
        role = _require(turn, "role", str, where)
        if role not in ROLES:
            raise _RowError(f"{where}.role={role!r}: expected one of {ROLES}")
        parts = _require(turn, "parts", list, where)
        turns.append(Turn(role, [parse_part(p, f"{where}.parts[{j}]", base_dir, tokens, tokenizer, pixels)
                                 for j, p in enumerate(parts)]))
    return Sample(sid, turns, source=source)


@dataclass
class RawRow:
    """One manifest row before parsing: file (path or URL), 1-based line, decoded JSON or why it is not."""

    file: str | Path
    line: int
    obj: Any = None
    error: str | None = None
    ignored_keys: tuple[str, ...] = ()  # keys of the source line the row does not use (counted in the report)


def manifest_rows(manifests: list[str | Path]) -> Iterator[RawRow]:
    """The non-blank lines of JSONL manifests (paths or URLs, streamed); a manifest without rows raises."""
    for manifest in manifests:
        manifest = manifest if is_url(manifest) else Path(manifest)
        if not is_file(manifest):
            raise FileNotFoundError(f"manifest {manifest} does not exist")
        rows = 0
        for line_no, line in enumerate(read_lines(manifest), start=1):
            if not line.strip():
                continue
            rows += 1
            try:
                row = RawRow(manifest, line_no, json.loads(line))
            except ValueError as exc:  # bad JSON or bad UTF-8
                row = RawRow(manifest, line_no, error=f"invalid JSON: {exc}")
            yield row
        if not rows:
            raise ValueError(f"manifest {manifest} holds no rows")


def build_shards(manifests: list[str | Path], out_dir: str | Path, tokens: SpecialTokens,
                 tokenizer: TextTokenizer | None = None, length_fn: LengthFn | None = None,
                 on_error: Literal["raise", "skip"] = "raise", rows_per_shard: int = 4096,
                 source: str = "default", pixels: PixelEncoder | None = None,
                 assets: DatasetAssets | None = None) -> BuildReport:
    """Build Parquet shards under `out_dir` from JSONL manifests (module docstring)."""
    return build_rows(manifest_rows(manifests), out_dir, tokens, tokenizer, length_fn, on_error, rows_per_shard,
                      source, pixels, assets)


def build_rows(rows: Iterable[RawRow], out_dir: str | Path, tokens: SpecialTokens,
               tokenizer: TextTokenizer | None = None, length_fn: LengthFn | None = None,
               on_error: Literal["raise", "skip"] = "raise", rows_per_shard: int = 4096,
               source: str = "default", pixels: PixelEncoder | None = None,
               assets: DatasetAssets | None = None) -> BuildReport:
    """`build_shards` over rows from any producer (manifests, an image folder)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
    if pixels is not None and (pixels.tokenizer.codebook_size, pixels.tokenizer.num_codebooks) != \
            (tokens.codebook_size, tokens.num_codebooks):
        raise ValueError(f"the visual tokenizer codes {pixels.tokenizer.num_codebooks} codebooks of "
                         f"{pixels.tokenizer.codebook_size}; the special tokens say num_codebooks="
                         f"{tokens.num_codebooks}, codebook_size={tokens.codebook_size}")

    report = BuildReport()

    def parse(raw: RawRow) -> PendingRow:
        for key in raw.ignored_keys:
            report.ignored_keys[key] = report.ignored_keys.get(key, 0) + 1
        if raw.error is not None:
            return PendingRow(raw, None, _RowError(raw.error))
        try:
            return PendingRow(raw, parse_row(raw.obj, parent(raw.file), tokens, tokenizer, source, pixels is not None))
        except _RowError as exc:
            return PendingRow(raw, None, exc)

    pending: Iterator[PendingRow] = (parse(raw) for raw in rows)
    if pixels is not None:
        pending = pixels(pending)
    writer = ShardWriter(out_dir, tokens, length_fn, rows_per_shard, assets=assets)
    with contextlib.closing(pending) as stream:  # closing stops the pixel readers on an error
        for row in stream:
            reason = None if row.error is None else str(row.error)
            if reason is None:
                try:
                    check_sample(row.sample, tokens)  # every check training's layout makes (reserved ids, ...)
                    writer.write(row.sample)  # validates, computes laid-out lengths
                except ValueError as exc:
                    reason = str(exc)
            if reason is not None:
                if on_error == "raise":
                    raise BuildError(f"{row.key.file}:{row.key.line}: {reason}")  # flushed shards stay; no report
                report.skipped.append(Skipped(str(row.key.file), row.key.line, reason))
    report.shards = [str(p) for p in writer.close()]
    report.rows_written = writer.num_rows
    Path(out_dir, "build_report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report
