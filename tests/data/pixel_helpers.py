"""Helpers for the image-file tests: small generated pictures on disk, and truncated / unreadable files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

PALETTE = {"red": (220, 40, 30), "green": (40, 190, 70), "blue": (30, 60, 210), "yellow": (230, 210, 50),
           "white": (240, 240, 240), "black": (15, 15, 15)}


def picture(rng: np.random.Generator, height: int, width: int, colour: str | None = None) -> np.ndarray:
    """uint8 [H, W, 3]: a plain background with one rectangle (of `colour`) and mild noise."""
    names = list(PALETTE)
    background = PALETTE[names[int(rng.integers(len(names)))]]
    image = np.empty((height, width, 3), np.float64)
    image[:] = background
    h, w = int(rng.integers(height // 3, height // 2 + 1)), int(rng.integers(width // 3, width // 2 + 1))
    y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
    image[y:y + h, x:x + w] = PALETTE[colour or names[int(rng.integers(len(names)))]]
    image += rng.normal(0, 2.0, image.shape)
    return image.clip(0, 255).round().astype(np.uint8)


def write_pictures(directory: Path, count: int, height: int, width: int, seed: int = 0,
                   suffix: str = ".png") -> list[tuple[Path, np.ndarray, str]]:
    """`count` pictures as files named 000<suffix>, ...; returns (path, pixels, caption) each."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        colour = list(PALETTE)[i % len(PALETTE)]
        pixels = picture(rng, height, width, colour)
        path = directory / f"{i:03d}{suffix}"
        Image.fromarray(pixels).save(path)
        out.append((path, pixels, f"a {colour} box"))
    return out


def write_imagefolder(directory: Path, count: int, height: int, width: int, seed: int = 0) -> list[dict]:
    """An HF-style imagefolder: pictures plus metadata.jsonl lines {"file_name", "text"}; returns the lines."""
    lines = [{"file_name": p.name, "text": caption}
             for p, _, caption in write_pictures(directory, count, height, width, seed)]
    (directory / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def write_truncated_png(path: Path, size: int = 32) -> Path:
    """A PNG cut off halfway through its data."""
    noise = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path
