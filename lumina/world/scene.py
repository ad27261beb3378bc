"""The procedural scene world: one coloured shape on a black 32x32 canvas.

A scene is an `ObjectSpec` (shape, colour, size, position, plus a +-1 px jitter that does not change the
ground truth); `render` draws it as [3, 32, 32] in [-1, 1]. Each of the 3 * 7 * 2 * 9 = 378 combinations
belongs to exactly one split (fixed 80/10/10), so val/test never show a combination seen in training.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass

import torch

IMAGE_SIZE = 32
SHAPES = ("circle", "square", "triangle")
# every non-black corner of the RGB cube: channels differ by >= 1.0 in [0, 1] between any two colours
COLOURS = {
    "red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "yellow": (1, 1, 0),
    "magenta": (1, 0, 1), "cyan": (0, 1, 1), "white": (1, 1, 1),
}
SIZES = {"small": 8, "large": 14}  # extent in pixels
ROWS = {"top": 8, "middle": 16, "bottom": 24}  # centre y in pixels
COLS = {"left": 8, "center": 16, "right": 24}  # centre x in pixels
POSITIONS = tuple(f"{r} {c}" for r in ROWS for c in COLS)  # "top left", ..., "bottom right"
SPLITS = ("train", "val", "test")
JITTER = 1  # px; never changes the ground-truth position class (cells are 8 px apart)
_SPLIT_SEED = 20260101


@dataclass(frozen=True)
class ObjectSpec:
    shape: str
    colour: str
    size: str
    position: str
    dx: int = 0
    dy: int = 0

    def __post_init__(self) -> None:
        for name, allowed in (("shape", SHAPES), ("colour", tuple(COLOURS)), ("size", tuple(SIZES)),
                              ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ObjectSpec.{name}={getattr(self, name)!r}: expected one of {allowed}")
        for name in ("dx", "dy"):
            if abs(getattr(self, name)) > JITTER:
                raise ValueError(f"ObjectSpec.{name}={getattr(self, name)}: jitter must lie in [-{JITTER}, {JITTER}]")

    @property
    def combination(self) -> tuple[str, str, str, str]:
        return (self.shape, self.colour, self.size, self.position)

    @property
    def centre(self) -> tuple[int, int]:
        """(x, y) in pixels, pixel i covering [i, i + 1)."""
        row, col = self.position.split()
        return COLS[col] + self.dx, ROWS[row] + self.dy

    def with_(self, **changes: str | int) -> ObjectSpec:
        return dataclasses.replace(self, **changes)


def shape_mask(shape: str, extent: int, cx: float, cy: float, size: int = IMAGE_SIZE) -> torch.Tensor:
    """Boolean [size, size] mask of a shape of `extent` px centred at (cx, cy) (triangle: apex up)."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    y, x = coords[:, None], coords[None, :]
    half = extent / 2
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 < half**2
    if shape == "square":
        return ((x - cx).abs() < half) & ((y - cy).abs() < half)
    if shape == "triangle":
        depth = y - (cy - half)  # 0 at the apex row, `extent` at the base
        return (depth > 0) & (depth < extent) & ((x - cx).abs() < depth / 2)
    raise ValueError(f"shape={shape!r}: expected one of {SHAPES}")


def render(spec: ObjectSpec) -> torch.Tensor:
    """The scene as a float image [3, 32, 32] in [-1, 1] (black background)."""
    cx, cy = spec.centre
    mask = shape_mask(spec.shape, SIZES[spec.size], cx, cy)
    colour = torch.tensor(COLOURS[spec.colour], dtype=torch.float32)
    image = mask[None].float() * colour[:, None, None]
    return image * 2 - 1


def all_combinations() -> list[tuple[str, str, str, str]]:
    return list(itertools.product(SHAPES, COLOURS, SIZES, POSITIONS))


def _split_table() -> dict[tuple[str, str, str, str], str]:
    combos = all_combinations()
    random.Random(_SPLIT_SEED).shuffle(combos)
    n_val = n_test = len(combos) // 10
    table = {c: "test" for c in combos[:n_test]}
    table.update({c: "val" for c in combos[n_test:n_test + n_val]})
    table.update({c: "train" for c in combos[n_test + n_val:]})
    return table


SPLIT_OF = _split_table()


_BY_SPLIT = {split: sorted(c for c, s in SPLIT_OF.items() if s == split) for split in SPLITS}


def combinations_in(split: str) -> list[tuple[str, str, str, str]]:
    """The (shape, colour, size, position) combinations of one split, sorted."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    return _BY_SPLIT[split]


def random_spec(rng: random.Random, split: str) -> ObjectSpec:
    """A scene whose combination lies in `split`, with a random jitter."""
    shape, colour, size, position = rng.choice(combinations_in(split))
    return ObjectSpec(shape, colour, size, position, dx=rng.randint(-JITTER, JITTER), dy=rng.randint(-JITTER, JITTER))
