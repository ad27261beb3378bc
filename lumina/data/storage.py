"""Samples on disk: Parquet shards of `Sample` rows, plus in-memory datasets with the same interface.

Row schema (plain Arrow types, readable by any Arrow tool):
    id      string
    source  string                       mixture source name
    turns   list<struct<role: string, parts: list<struct<
                kind: string             "text" | "image" | "video" | "mesh3d"
                ids: list<int32>         text token ids (null for media)
                grid: list<int32>        (h, w) | (t, h, w) | (z, y, x) (null for text)
                codes: list<int32>       the [N, C] code grid flattened row-major (null for text)
            >>>>
    len_keep, len_drop_text, len_drop_image, len_drop_both   int32: laid-out lengths of the CFG variants
File metadata b"lumina": JSON {"format", "version", "special_tokens", "assets"} (optional `DatasetAssets`,
paths relative to the shard); readers refuse other settings, and all shards must record the same assets.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lumina.contract.schema import GRID_RANK, Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import DatasetAssets
from lumina.data.noise import id_hashes
from lumina.files.fs import DEFAULT_RETRY, Retry, filesystem, is_file, is_url, open_binary, with_retries

FORMAT, VERSION = "lumina-samples", 1
METADATA_KEY = b"lumina"
ROLES = ("system", "user", "assistant")
# (column, drop_text, drop_image) for the four CFG-dropout variants
LENGTH_VARIANTS = (("len_keep", False, False), ("len_drop_text", True, False),
                   ("len_drop_image", False, True), ("len_drop_both", True, True))
LENGTH_COLUMNS = tuple(name for name, _, _ in LENGTH_VARIANTS)

PART_TYPE = pa.struct([("kind", pa.string()), ("ids", pa.list_(pa.int32())), ("grid", pa.list_(pa.int32())),
                       ("codes", pa.list_(pa.int32()))])
TURN_TYPE = pa.struct([("role", pa.string()), ("parts", pa.list_(PART_TYPE))])
SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("turns", pa.list_(TURN_TYPE))]
                   + [(name, pa.int32()) for name in LENGTH_COLUMNS])

LengthFn = Callable[[Sample, bool, bool], int]  # (sample, drop_text, drop_image) -> laid-out length


def layout_length_fn(tokens: SpecialTokens) -> LengthFn:
    """The layout's `laid_out_length` bound to `tokens`."""
    from lumina.data.sequence_layout import laid_out_length

    return lambda sample, drop_text, drop_image: laid_out_length(sample, tokens, drop_text, drop_image)


def sample_lengths(sample: Sample, length_fn: LengthFn) -> tuple[int, int, int, int]:
    """Laid-out lengths of the four CFG variants, in LENGTH_COLUMNS order."""
    return tuple(int(length_fn(sample, dt, di)) for _, dt, di in LENGTH_VARIANTS)  # type: ignore[return-value]


def validate_sample(sample: Sample, tokens: SpecialTokens) -> None:
    """Structural checks storage relies on; raises ValueError naming the sample and field."""
    if not isinstance(sample.id, str) or not sample.id:
        raise ValueError(f"sample.id={sample.id!r}: must be a non-empty string")
    if not sample.turns:
        raise ValueError(f"sample {sample.id!r}: turns is empty")
    for k, turn in enumerate(sample.turns):
        if turn.role not in ROLES:
            raise ValueError(f"sample {sample.id!r}: turns[{k}].role={turn.role!r}, expected one of {ROLES}")
        for j, part in enumerate(turn.parts):
            where = f"sample {sample.id!r}: turns[{k}].parts[{j}]"
            if isinstance(part, Text):
                bad = [i for i in part.ids if not 0 <= int(i) < tokens.text_vocab_size]
                if bad:
                    raise ValueError(f"{where}.ids has values outside [0, {tokens.text_vocab_size}), e.g. {bad[:4]}")
            elif isinstance(part, Media):
                part.validate(tokens.codebook_size, tokens.num_codebooks, where=where)
            else:
                raise ValueError(f"{where} is {type(part).__name__}; expected Text or Media")


def sample_to_row(sample: Sample, lengths: Sequence[int]) -> dict:
    turns = []
    for turn in sample.turns:
        parts = []
        for part in turn.parts:
            if isinstance(part, Text):
                parts.append({"kind": "text", "ids": [int(i) for i in part.ids], "grid": None, "codes": None})
            else:
                parts.append({"kind": part.kind, "ids": None, "grid": [int(g) for g in part.grid],
                              "codes": part.codes.reshape(-1).tolist()})
        turns.append({"role": turn.role, "parts": parts})
    row = {"id": sample.id, "source": sample.source, "turns": turns}
    row.update(zip(LENGTH_COLUMNS, (int(n) for n in lengths), strict=True))
    return row


def row_to_sample(row: dict, num_codebooks: int, where: str = "row") -> Sample:
    turns = []
    for k, turn in enumerate(row["turns"]):
        parts: list = []
        for j, part in enumerate(turn["parts"]):
            kind = part["kind"]
            if kind == "text":
                parts.append(Text(list(part["ids"])))
                continue
            if kind not in GRID_RANK:
                raise ValueError(f"{where}: turns[{k}].parts[{j}].kind={kind!r}, expected text or {sorted(GRID_RANK)}")
            grid = tuple(part["grid"])
            codes = part["codes"]
            if len(codes) != math.prod(grid) * num_codebooks:
                raise ValueError(f"{where}: turns[{k}].parts[{j}] has {len(codes)} code values; grid {grid} with "
                                 f"{num_codebooks} codebooks needs {math.prod(grid) * num_codebooks}")
            parts.append(Media(kind, torch.tensor(codes, dtype=torch.int64).view(-1, num_codebooks), grid))
        turns.append(Turn(turn["role"], parts))
    return Sample(row["id"], turns, source=row["source"])


def settings_metadata(tokens: SpecialTokens, assets: DatasetAssets | None = None) -> dict[bytes, bytes]:
    """assets: paths already relative to the shard's directory."""
    doc = {"format": FORMAT, "version": VERSION, "special_tokens": dataclasses.asdict(tokens)}
    if assets is not None:
        doc["assets"] = assets.to_json()
    return {METADATA_KEY: json.dumps(doc, sort_keys=True).encode()}


def read_metadata(path: str | Path, schema: pa.Schema) -> tuple[SpecialTokens, DatasetAssets]:
    """The SpecialTokens and tokenizers (paths resolved) in the Arrow schema of the shard at `path`."""
    meta = schema.metadata or {}
    if METADATA_KEY not in meta:
        raise ValueError(f"{path}: no {METADATA_KEY.decode()!r} file metadata; not a lumina sample shard")
    doc = json.loads(meta[METADATA_KEY])
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{path}: format={doc.get('format')!r} version={doc.get('version')!r}, "
                         f"expected {FORMAT!r} version {VERSION}")
    tokens = SpecialTokens.from_record(doc["special_tokens"], str(path))
    if doc.get("assets") is None:
        return tokens, DatasetAssets()
    if is_url(path):
        raise ValueError(f"{path}: records tokenizer files beside the shard, which lumina reads from local disk "
                         "only; keep shards that record tokenizers on a local or mounted file system")
    return tokens, DatasetAssets.from_json(doc["assets"], str(path)).resolved_from(Path(path).parent)


def settings_mismatch(found: SpecialTokens, expected: SpecialTokens) -> list[str]:
    """'field: found X, expected Y' for every differing field."""
    a, b = dataclasses.asdict(found), dataclasses.asdict(expected)
    return [f"{k}: found {a[k]}, expected {b[k]}" for k in a if a[k] != b[k]]


class ShardWriter:
    """Writes validated samples with unique ids to `out_dir/{prefix}-00000.parquet`, ..., `rows_per_shard`
    rows each; lengths from `length_fn` (default the layout's); `assets` (absolute paths) recorded in each."""

    def __init__(self, out_dir: str | Path, tokens: SpecialTokens, length_fn: LengthFn | None = None,
                 rows_per_shard: int = 4096, row_group_size: int = 256, prefix: str = "shard",
                 assets: DatasetAssets | None = None):
        if rows_per_shard <= 0 or row_group_size <= 0:
            raise ValueError(f"rows_per_shard={rows_per_shard}, row_group_size={row_group_size}: must be positive")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tokens = tokens
        self.length_fn = length_fn or layout_length_fn(tokens)
        self.rows_per_shard = rows_per_shard
        self.row_group_size = row_group_size
        self.prefix = prefix
        self.metadata = settings_metadata(tokens, None if assets is None else assets.relative_to(self.out_dir))
        self.paths: list[Path] = []
        self.num_rows = 0
        self._rows: list[dict] = []
        self._ids: set[str] = set()

    def write(self, sample: Sample) -> None:
        validate_sample(sample, self.tokens)
        if sample.id in self._ids:
            raise ValueError(f"sample.id={sample.id!r} is written twice")
        row = sample_to_row(sample, sample_lengths(sample, self.length_fn))
        self._ids.add(sample.id)
        self._rows.append(row)
        self.num_rows += 1
        if len(self._rows) >= self.rows_per_shard:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA).replace_schema_metadata(self.metadata)
        path = self.out_dir / f"{self.prefix}-{len(self.paths):05d}.parquet"
        pq.write_table(table, path, row_group_size=self.row_group_size, compression="zstd")
        self.paths.append(path)
        self._rows = []

    def close(self) -> list[Path]:
        self._flush()
        return self.paths

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_samples(samples: Iterable[Sample], out_dir: str | Path, tokens: SpecialTokens,
                  length_fn: LengthFn | None = None, rows_per_shard: int = 4096, prefix: str = "shard") -> list[Path]:
    """Write samples as Parquet shards; returns the shard paths."""
    with ShardWriter(out_dir, tokens, length_fn, rows_per_shard, prefix=prefix) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.paths


class SampleDataset(Protocol):
    """Random access to samples; `laid_out_lengths()` [N, 4] in the narrowest unsigned type, `id_hashes()` [N]
    uint64 (`noise.id_hashes`), `tokens` the SpecialTokens the lengths were computed with."""

    tokens: SpecialTokens

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Sample: ...

    def laid_out_lengths(self) -> np.ndarray: ...

    def id_hashes(self) -> np.ndarray: ...

    def sample_id(self, index: int) -> str: ...

    def sample_ids(self) -> list[str]: ...


def narrow_lengths(lengths: np.ndarray) -> np.ndarray:
    """Non-negative laid-out lengths in the narrowest unsigned type that holds them (at least uint8)."""
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"laid-out lengths hold a negative value ({int(lengths.min())})")
    top = int(lengths.max()) if lengths.size else 0
    return lengths.astype(np.min_scalar_type(max(top, 255)), copy=False)


def checked_index(index: int, n: int) -> int:
    """`index` (negative from the end) into a dataset of n samples; TypeError / IndexError naming it."""
    if not isinstance(index, int | np.integer) or isinstance(index, bool):
        raise TypeError(f"index={index!r}: expected an int")
    if not -n <= index < n:
        raise IndexError(f"index={index} out of range for a dataset of {n} samples")
    return int(index) % n


def shard_paths(paths: str | Path | Sequence[str | Path], retry: Retry = DEFAULT_RETRY) -> list[str | Path]:
    """A file, a directory (its *.parquet, sorted), or a list of either -> shard files; a URL names an object
    or a prefix holding *.parquet objects (kept as strings)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[str | Path] = []
    for item in items:
        if is_url(item):
            out += _remote_shards(str(item), retry)
            continue
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.parquet"))
            if not found:
                raise FileNotFoundError(f"{p}: directory holds no *.parquet shards")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such shard file or directory")
    if not out:
        raise ValueError("no shard paths given")
    return out


def _remote_shards(url: str, retry: Retry) -> list[str]:
    if is_file(url, retry):
        return [url]
    fs, inner = filesystem(url)
    protocol = url.split("://", 1)[0]
    found = sorted(with_retries(url, "listing", lambda: fs.glob(inner.rstrip("/") + "/*.parquet"), retry))
    if not found:
        raise FileNotFoundError(f"{url}: no such shard, and no *.parquet shards under it")
    return [f"{protocol}://{key}" for key in found]


@dataclass(frozen=True)
class _ShardIndex:
    """One shard's settings, tokenizers, footer and byte size (for payload reads), lengths [n, 4], ids."""

    tokens: SpecialTokens
    assets: DatasetAssets
    metadata: pq.FileMetaData
    size: int
    lengths: np.ndarray
    ids: pa.ChunkedArray


def _read_index(path: str | Path, retry: Retry) -> _ShardIndex:
    """One shard's footer and its id and length columns, in one open (retried as a whole)."""

    def read() -> _ShardIndex:
        with open_binary(str(path)) as f:
            try:
                file = pq.ParquetFile(f)
            except pa.ArrowInvalid as exc:  # truncated or not Parquet: bad data, not a transient failure
                raise ValueError(f"{path}: not a readable Parquet shard ({exc})") from exc
            schema = file.schema_arrow
            tokens, assets = read_metadata(path, schema)
            missing = [c for c in ("id", *LENGTH_COLUMNS) if c not in schema.names]
            if missing:
                raise ValueError(f"{path}: lacks the columns {missing}; not a lumina sample shard")
            table = file.read(columns=["id", *LENGTH_COLUMNS])
            size = f.seek(0, 2)
        lengths = np.stack([table.column(c).to_numpy() for c in LENGTH_COLUMNS], axis=1) if table.num_rows else (
            np.zeros((0, 4), np.int32))
        if lengths.size and lengths.min() < 0:
            row, col = (int(v) for v in np.argwhere(lengths < 0)[0])
            raise ValueError(f"{path}: row {row} has {LENGTH_COLUMNS[col]}={int(lengths[row, col])}; laid-out lengths "
                             "cannot be negative")
        return _ShardIndex(tokens, assets, file.metadata, size, lengths, table.column("id"))

    return with_retries(str(path), "reading the shard's footer and length columns", read, retry)


class ParquetSampleDataset:
    """Random access to Parquet sample shards, local or on an object store (`lumina.files.fs`, reads retried
    within `retry`). Lengths and ids are read eagerly (`readers` shards at a time); payloads per row group on
    demand, an LRU of `cache_row_groups` per process. tokens: the settings expected (others raise ValueError);
    `assets`: the tokenizers the shards record (paths resolved)."""

    def __init__(self, paths: str | Path | Sequence[str | Path], tokens: SpecialTokens | None = None,
                 cache_row_groups: int = 16, retry: Retry = DEFAULT_RETRY, readers: int = 16):
        if cache_row_groups < 1:
            raise ValueError(f"cache_row_groups={cache_row_groups}: must be >= 1")
        self.paths = shard_paths(paths, retry)
        self.retry = retry
        with ThreadPoolExecutor(max_workers=max(1, min(readers, len(self.paths)))) as pool:
            index = list(pool.map(lambda path: _read_index(path, retry), self.paths))
        found = index[0].tokens
        for path, shard in zip(self.paths, index, strict=True):
            for reference, what in ((found, f"shard {self.paths[0]}"), (tokens, "the expected settings")):
                if reference is not None and shard.tokens != reference:
                    raise ValueError(f"{path}: special-token/codebook settings differ from {what}: "
                                     + "; ".join(settings_mismatch(shard.tokens, reference)))
        self.tokens = found
        self.assets = index[0].assets
        for path, shard in zip(self.paths[1:], index[1:], strict=True):
            if not shard.assets.same_as(self.assets):
                raise ValueError(f"{path}: records other tokenizers than {self.paths[0]}: "
                                 f"{shard.assets.describe()} vs {self.assets.describe()}")
        self._groups: list[tuple[int, int, int]] = []  # (shard, row group, first global row)
        self._shard_starts: list[int] = []
        start = 0
        for s, shard in enumerate(index):
            self._shard_starts.append(start)
            for g in range(shard.metadata.num_row_groups):
                self._groups.append((s, g, start))
                start += shard.metadata.row_group(g).num_rows
        self._footers = [(shard.metadata, shard.size) for shard in index]
        self._starts = np.array([g[2] for g in self._groups], dtype=np.int64)
        self._lengths = narrow_lengths(np.concatenate([shard.lengths for shard in index]))
        chunks = [c.cast(pa.large_string()) for shard in index for c in shard.ids.chunks]  # 64-bit offsets
        self._ids = pa.chunked_array(chunks, pa.large_string()).combine_chunks()
        self._hashes = id_hashes(self._ids)
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cache_size = cache_row_groups

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # DataLoader workers start with an empty row-group cache
        return state

    def __len__(self) -> int:
        return len(self._ids)

    def laid_out_lengths(self) -> np.ndarray:
        """[N, 4] laid-out lengths in LENGTH_COLUMNS order (keep, drop_text, drop_image, drop_both)."""
        return self._lengths

    def id_hashes(self) -> np.ndarray:
        return self._hashes

    def sample_id(self, index: int) -> str:
        return self._ids[checked_index(index, len(self))].as_py()

    def sample_ids(self) -> list[str]:
        return self._ids.to_pylist()

    def _row_group(self, g: int) -> pa.Table:
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        shard, group, _ = self._groups[g]
        path = str(self.paths[shard])
        footer, size = self._footers[shard]

        def read() -> pa.Table:  # the known footer and size; the three column chunks in one coalesced read
            with open_binary(path, size) as f:
                file = pq.ParquetFile(f, metadata=footer, pre_buffer=True)
                return file.read_row_group(group, columns=["id", "source", "turns"])

        table = with_retries(path, f"reading row group {group}", read, self.retry)
        self._cache[g] = table
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return table

    def __getitem__(self, index: int) -> Sample:
        i = checked_index(index, len(self))
        g = int(np.searchsorted(self._starts, i, side="right")) - 1
        table = self._row_group(g)
        j = i - int(self._starts[g])
        row = {name: table.column(name)[j].as_py() for name in ("id", "source", "turns")}
        shard = self._groups[g][0]
        return row_to_sample(row, self.tokens.num_codebooks,
                             where=f"{self.paths[shard]} row {i - self._shard_starts[shard]}")


class InMemorySampleDataset:
    """A list of samples with their laid-out lengths (computed once with `length_fn`)."""

    def __init__(self, samples: Sequence[Sample], tokens: SpecialTokens, length_fn: LengthFn | None = None):
        length_fn = length_fn or layout_length_fn(tokens)
        seen: set[str] = set()
        for sample in samples:
            validate_sample(sample, tokens)
            if sample.id in seen:
                raise ValueError(f"sample.id={sample.id!r} appears twice")
            seen.add(sample.id)
        self.samples = list(samples)
        self.tokens = tokens
        self.length_fn = length_fn
        self._lengths = narrow_lengths(np.array([sample_lengths(s, length_fn) for s in self.samples],
                                                dtype=np.int64).reshape(-1, 4))
        self._hashes = id_hashes([s.id for s in self.samples])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[checked_index(index, len(self))]

    def laid_out_lengths(self) -> np.ndarray:
        return self._lengths

    def id_hashes(self) -> np.ndarray:
        return self._hashes

    def sample_id(self, index: int) -> str:
        return self.samples[checked_index(index, len(self))].id

    def sample_ids(self) -> list[str]:
        return [s.id for s in self.samples]

    def save(self, out_dir: str | Path, rows_per_shard: int = 4096, prefix: str = "shard") -> list[Path]:
        """Write as Parquet shards (same tokens and length function)."""
        return write_samples(self.samples, out_dir, self.tokens, self.length_fn, rows_per_shard, prefix)
