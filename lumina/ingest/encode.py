"""Streaming pixel encoding for `lumina-data build`: rows whose parts name image files become rows of codes.

Rows leave in the order they arrive, in chunks of at least `batch_size` frames (at most 8 x batch_size rows).
A chunk's files are read (`lumina.tokenizers.pixels.read_image`) here or by `workers` forked processes, which read
the next chunk while this process encodes the current one; images of one size are encoded `batch_size` at a
time, each video through `encode_video`. A file that cannot be read fails its row only (`PendingRow.error`,
naming the part and the file). The codes do not depend on `batch_size` or `workers`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lumina.contract.schema import Media, Sample
from lumina.tokenizers.pixels import PixelError, Preparation, read_image, to_signed
from lumina.tokenizers.visual import VisualTokenizer


@dataclass
class PixelPart:
    """A media part still to encode: kind "image" (one file) or "video" (its frames, in order)."""

    kind: str
    files: tuple[Path, ...]
    where: str


@dataclass
class PendingRow:
    """key: whatever names the row (manifest file and line); error: why it cannot be written, if it cannot."""

    key: Any
    sample: Sample | None
    error: Exception | None = None

    @property
    def pixel_parts(self) -> list[tuple[list, int, PixelPart]]:
        """(parts list, index, part) of every PixelPart of the sample."""
        if self.sample is None or self.error is not None:
            return []
        return [(turn.parts, j, p) for turn in self.sample.turns for j, p in enumerate(turn.parts)
                if isinstance(p, PixelPart)]


def read_frames(files: tuple[Path, ...], prep: Preparation) -> np.ndarray | PixelError:
    """uint8 [F, H, W, 3], or the first file's error (returned, so that one bad file spoils only its row)."""
    try:
        frames = [read_image(f, prep) for f in files]
    except PixelError as exc:
        return exc
    sizes = sorted({f.shape[:2] for f in frames})
    if len(sizes) > 1:
        return PixelError(f"frames {files[0]} ... come out at different sizes {sizes}; a video's frames must match")
    return np.stack(frames)


def _read_many(jobs: list[tuple[Path, ...]], prep: Preparation) -> list[np.ndarray | PixelError]:
    return [read_frames(files, prep) for files in jobs]


class FrameReader:
    """Reads jobs (tuples of files) here or in `workers` forked processes; results in job order."""

    def __init__(self, prep: Preparation, workers: int = 0):
        if workers < 0:
            raise ValueError(f"workers={workers}: must be >= 0")
        self.prep, self.workers = prep, workers
        self.pool = None
        if workers:
            # fork before any progress-bar thread starts; the workers only run Pillow and numpy
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
            list(self.pool.map(int, range(workers)))

    def submit(self, jobs: list[tuple[Path, ...]]) -> Callable[[], list[np.ndarray | PixelError]]:
        if self.pool is None:
            return lambda: _read_many(jobs, self.prep)
        step = max(1, -(-len(jobs) // (2 * self.workers)))
        futures = [self.pool.submit(_read_many, jobs[i:i + step], self.prep) for i in range(0, len(jobs), step)]
        return lambda: [r for f in futures for r in f.result()]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __enter__(self) -> FrameReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunks(rows: Iterable[PendingRow], frames_per_chunk: int) -> Iterator[list[PendingRow]]:
    """Consecutive rows holding >= frames_per_chunk frames (or 8x as many rows, for rows without images)."""
    chunk: list[PendingRow] = []
    frames = 0
    for row in rows:
        chunk.append(row)
        frames += sum(len(p.files) for _, _, p in row.pixel_parts)
        if frames >= frames_per_chunk or len(chunk) >= 8 * frames_per_chunk:
            yield chunk
            chunk, frames = [], 0
    if chunk:
        yield chunk


def encode_images(tokenizer: VisualTokenizer, arrays: list[np.ndarray], batch_size: int
                  ) -> list[tuple[torch.Tensor, tuple[int, int]]]:
    """uint8 [H, W, 3] images (any sizes) -> (codes [h * w, C], grid) each, batch_size per size at a time."""
    by_size: dict[tuple[int, ...], list[int]] = {}
    for i, array in enumerate(arrays):
        by_size.setdefault(array.shape, []).append(i)
    out: list[tuple[torch.Tensor, tuple[int, int]]] = [None] * len(arrays)  # type: ignore[list-item]
    for members in by_size.values():
        for start in range(0, len(members), batch_size):
            chosen = members[start:start + batch_size]
            codes, grid = tokenizer.encode(to_signed([arrays[i] for i in chosen]))
            for i, c in zip(chosen, codes, strict=True):
                out[i] = (c, grid)
    return out


class PixelEncoder:
    """Turns the PixelParts of streamed rows into Media (module docstring). max_edge: None the tokenizer's
    image_size, 0 keeps the size; progress: called with the frames encoded after each chunk."""

    def __init__(self, tokenizer: VisualTokenizer, batch_size: int = 64, workers: int = 0,
                 progress: Callable[[int], None] | None = None, max_edge: int | None = None):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size}: must be positive")
        self.tokenizer, self.batch_size, self.workers, self.progress = tokenizer, batch_size, workers, progress
        self.prep = Preparation(tokenizer.image_size if max_edge is None else max_edge, tokenizer.patch_size)

    def __call__(self, rows: Iterable[PendingRow]) -> Iterator[PendingRow]:
        with FrameReader(self.prep, self.workers) as reader:
            waiting = None
            for chunk in _chunks(rows, self.batch_size):
                jobs = [p.files for row in chunk for _, _, p in row.pixel_parts]
                read = reader.submit(jobs)  # reads ahead while the previous chunk encodes
                if waiting is not None:
                    yield from self._finish(*waiting)
                waiting = (chunk, read)
            if waiting is not None:
                yield from self._finish(*waiting)

    def _finish(self, chunk: list[PendingRow], read: Callable[[], list]) -> list[PendingRow]:
        places = [(row, parts, j, part) for row in chunk for parts, j, part in row.pixel_parts]
        results = read()
        images = [r[0] for (_, _, _, part), r in zip(places, results, strict=True)
                  if part.kind == "image" and not isinstance(r, PixelError)]
        encoded = iter(encode_images(self.tokenizer, images, self.batch_size))
        for (row, parts, j, part), result in zip(places, results, strict=True):
            if isinstance(result, PixelError):
                if row.error is None:
                    row.error = PixelError(f"{part.where}: {result}")
                continue
            if part.kind == "image":
                codes, grid = next(encoded)
            else:
                try:
                    codes, grid = self.tokenizer.encode_video(to_signed(result))
                except ValueError as exc:  # a video the tokenizer cannot code (AToken: frames in fours)
                    if row.error is None:
                        row.error = PixelError(f"{part.where}.files: {exc}")
                    continue
            parts[j] = Media(part.kind, codes, tuple(grid))
        if self.progress is not None:
            self.progress(sum(len(part.files) for *_, part in places))
        return chunk
