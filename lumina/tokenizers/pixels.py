"""Image files -> pixel arrays of any aspect ratio, prepared as the official InternLumina-U2 tools prepare them.

Every image file (build, tokenize-images, fit-tokenizer, lumina-generate) is read through Pillow:
    1. PNG, JPEG, WebP or BMP, by content; converted to RGB (alpha dropped, not composited); no EXIF rotation;
    2. with max_edge > 0 the long edge is resized to max_edge (LANCZOS, aspect ratio kept: size round(W * s),
       round(H * s), s = max_edge / max(W, H)); with upscale=False only a longer edge is shrunk;
    3. each side is centre-cropped to a multiple of the patch (offsets floor((W - W') / 2), ...).
A side under one patch after step 2, or an unreadable, truncated or missing file, is refused.
The official preparations are two `Preparation`s: `tools/tokenize_image.py` `prepare_image` (max_edge,
upscale=True) and `infer_mmu_sft.py` `prepare_image_for_encode` (--input_max_edge, 0 keeps the size;
--input_no_upscale).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from lumina.files.fs import read_bytes

FORMATS = ("PNG", "JPEG", "WEBP", "BMP")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


class PixelError(ValueError):
    """An image file that cannot become pixels; the message names the file."""


@dataclass(frozen=True)
class Preparation:
    """How an image file becomes pixels (module docstring): max_edge 0 keeps the size."""

    max_edge: int
    patch: int
    upscale: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_edge, int) or self.max_edge < 0:
            raise ValueError(f"max_edge={self.max_edge!r}: must be a non-negative integer (0 keeps the size)")
        if not isinstance(self.patch, int) or self.patch <= 0:
            raise ValueError(f"patch={self.patch!r}: must be a positive integer")


def read_image(path: str | Path, prep: Preparation) -> np.ndarray:
    """An image file (path or URL) -> uint8 [H, W, 3] (module docstring); PixelError naming the file."""
    try:
        data = read_bytes(path)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise PixelError(f"image file {path} does not exist") from exc
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.format not in FORMATS:
                raise PixelError(f"image file {path} is {opened.format}; expected one of {', '.join(FORMATS)}")
            opened.load()
            picture = opened.convert("RGB")
    except UnidentifiedImageError as exc:
        raise PixelError(f"image file {path} is not a readable image ({exc})") from exc
    except OSError as exc:  # Pillow's "image file is truncated", broken data streams, ...
        raise PixelError(f"image file {path} is truncated or corrupt ({exc})") from exc
    size = picture.size
    if prep.max_edge > 0 and (prep.upscale or max(size) > prep.max_edge):
        scale = prep.max_edge / max(size)
        size = (round(size[0] * scale), round(size[1] * scale))
    p = prep.patch
    if min(size) < p:
        raise PixelError(f"image file {path} is {picture.size[0]}x{picture.size[1]} px, {size[0]}x{size[1]} after "
                         f"resizing (max_edge={prep.max_edge}): a side is under one {p} px patch")
    if size != picture.size:
        picture = picture.resize(size, Image.LANCZOS)
    width, height = size
    crop_w, crop_h = width // p * p, height // p * p
    left, top = (width - crop_w) // 2, (height - crop_h) // 2
    return np.array(picture.crop((left, top, left + crop_w, top + crop_h)), dtype=np.uint8)


def to_signed(arrays: np.ndarray | list[np.ndarray]) -> torch.Tensor:
    """uint8 [B, H, W, 3] (or a list of [H, W, 3]) -> float32 [B, 3, H, W] in [-1, 1] as x / 255 * 2 - 1."""
    stacked = np.stack(arrays) if isinstance(arrays, list) else arrays
    return (torch.from_numpy(np.ascontiguousarray(stacked)).permute(0, 3, 1, 2).float() / 255.0) * 2 - 1


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """float [3, H, W] in [-1, 1] -> uint8 [H, W, 3] (clamped, rounded)."""
    return ((pixels.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()


def save_png(image: torch.Tensor, path: str | Path) -> None:
    """[3, H, W] in [0, 1] -> PNG file."""
    array = (image.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
    Image.fromarray(array).save(path)


def image_files(paths: list[str | Path]) -> list[Path]:
    """Files and directories (every PNG / JPEG / WebP / BMP file below, by suffix, sorted) -> image paths, in order."""
    found: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            found += sorted(p for p in item.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif item.is_file():
            found.append(item)
        else:
            raise FileNotFoundError(f"image file {item} does not exist")
    if not found:
        raise ValueError(f"no image files in {[str(p) for p in paths]}")
    return found
