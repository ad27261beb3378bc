"""In-memory sample schema: an id plus ordered turns of text ids and media code grids.

A turn is an ordered list of parts; a part is either a `Text` (token ids) or a `Media` (a code grid).
Media code grids are `[N, C]` int64 with N cells in row-major order of `grid`:
    image  grid = (h, w)        N = h*w
    video  grid = (t, h, w)     N = t*h*w, ordered by t, then y, then x (t = frame groups)
    mesh3d grid = (z, y, x)     N = z*y*x, ordered by z, then y, then x
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

MediaKind = Literal["image", "video", "mesh3d"]
Role = Literal["system", "user", "assistant"]
GRID_RANK = {"image": 2, "video": 3, "mesh3d": 3}


@dataclass
class Text:
    ids: list[int]


@dataclass
class Media:
    kind: MediaKind
    codes: torch.Tensor  # [N, C] int64
    grid: tuple[int, ...]

    def validate(self, codebook_size: int, num_codebooks: int, where: str = "media") -> None:
        if self.kind not in GRID_RANK:
            raise ValueError(f"{where}.kind={self.kind!r}: expected one of {sorted(GRID_RANK)}")
        if len(self.grid) != GRID_RANK[self.kind] or any(int(g) <= 0 for g in self.grid):
            raise ValueError(f"{where}.grid={self.grid}: a {self.kind} needs {GRID_RANK[self.kind]} positive sizes")
        if self.codes.dim() != 2 or self.codes.shape[1] != num_codebooks:
            raise ValueError(f"{where}.codes has shape {list(self.codes.shape)}, expected [N, {num_codebooks}]")
        if self.codes.shape[0] != math.prod(self.grid):
            raise ValueError(f"{where}.codes has {self.codes.shape[0]} cells but grid {self.grid} "
                             f"holds {math.prod(self.grid)}")
        if self.codes.dtype.is_floating_point:
            raise ValueError(f"{where}.codes has dtype {self.codes.dtype}; expected integers")
        bad = (self.codes < 0) | (self.codes >= codebook_size)
        if bad.any():
            raise ValueError(f"{where}.codes has values outside [0, {codebook_size}), "
                             f"e.g. {self.codes[bad][:4].tolist()}")


Part = Text | Media


@dataclass
class Turn:
    role: Role
    parts: list[Part] = field(default_factory=list)

    @property
    def media(self) -> list[Media]:
        return [p for p in self.parts if isinstance(p, Media)]


@dataclass
class Sample:
    id: str
    turns: list[Turn]
    source: str = "default"  # mixture source name
