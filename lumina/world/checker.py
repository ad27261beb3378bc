"""Deterministic ground-truth checker: classify a scene image's colour, shape, size and position from pixels.

`check_image(pixels, spec)` scores a generated image: the fraction of the four attributes it shows correctly.
Foreground: pixels brighter than mid-grey; colour: the palette corner nearest its mean RGB; position: the
cell nearest its bounding-box centre; shape and size: the template (at that centre +-1 px) of highest IoU.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from lumina.world.scene import COLOURS, COLS, IMAGE_SIZE, ROWS, SHAPES, SIZES, ObjectSpec, shape_mask

MIN_FOREGROUND_PX = 4
_TEMPLATE_KEYS = [(shape, size) for shape in SHAPES for size in SIZES]
_OFFSETS = [(ox, oy) for ox in (-0.5, 0.0, 0.5) for oy in (-0.5, 0.0, 0.5)]


@functools.lru_cache(maxsize=4096)
def _templates(cx: float, cy: float) -> np.ndarray:
    """[len(_TEMPLATE_KEYS) * len(_OFFSETS), 32 * 32] masks of every (shape, size) drawn at (cx, cy) +- 0.5 px."""
    return torch.stack([shape_mask(shape, SIZES[size], cx + ox, cy + oy).flatten()
                        for shape, size in _TEMPLATE_KEYS for ox, oy in _OFFSETS]).numpy()


def _as_unit_image(pixels: torch.Tensor) -> np.ndarray:
    if not isinstance(pixels, torch.Tensor) or pixels.shape != (3, IMAGE_SIZE, IMAGE_SIZE):
        shape = list(pixels.shape) if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise ValueError(f"pixels has shape {shape}; expected a [3, {IMAGE_SIZE}, {IMAGE_SIZE}] tensor in [-1, 1]")
    return ((pixels.detach().float().cpu().numpy() + 1) / 2).clip(0, 1)


def _nearest(value: float, table: dict[str, int]) -> str:
    return min(table, key=lambda name: abs(table[name] - value))


def classify_image(pixels: torch.Tensor) -> dict[str, str] | None:
    """{colour, shape, size, position} read from a [3, 32, 32] image in [-1, 1]; None if nothing is drawn."""
    image = _as_unit_image(pixels)
    foreground = image.max(axis=0) > 0.5
    if int(foreground.sum()) < MIN_FOREGROUND_PX:
        return None
    mean_rgb = image[:, foreground].mean(axis=1)
    rgb = tuple(int(v > 0.5) for v in mean_rgb)
    colour = next((name for name, value in COLOURS.items() if value == rgb), "black")
    ys, xs = np.nonzero(foreground)
    cx = (int(xs.min()) + int(xs.max()) + 1) / 2
    cy = (int(ys.min()) + int(ys.max()) + 1) / 2
    templates = _templates(cx, cy)  # [T, 32 * 32]
    flat = foreground.reshape(-1)
    iou = (templates & flat).sum(1) / (templates | flat).sum(1)
    shape, size = _TEMPLATE_KEYS[int(iou.argmax()) // len(_OFFSETS)]
    position = f"{_nearest(cy, ROWS)} {_nearest(cx, COLS)}"
    return {"colour": colour, "shape": shape, "size": size, "position": position}


def check_image(pixels: torch.Tensor, spec: ObjectSpec) -> float:
    """Fraction of {colour, shape, size, position} of `spec` that `pixels` [3, 32, 32] in [-1, 1] shows."""
    found = classify_image(pixels)
    if found is None:
        return 0.0
    truth = {"colour": spec.colour, "shape": spec.shape, "size": spec.size, "position": spec.position}
    return sum(found[k] == v for k, v in truth.items()) / len(truth)
