"""Image files -> square pixel arrays of a visual tokenizer's size (through Pillow).

Every image file is read the same way, by `lumina-data build`, `lumina-data fit-tokenizer` and `lumina-generate`:
    1. formats: PNG, JPEG and WebP only (by content, not by file name);
    2. the EXIF orientation is applied (`ImageOps.exif_transpose`), so a rotated phone photo comes out upright;
    3. converted to RGB (greyscale and palette images expanded; an alpha channel is dropped, not composited);
    4. resized so that the short side is S (the tokenizer's image size), aspect ratio kept, with LANCZOS
       (no resize when the short side already is S);
    5. the centre S x S square is cropped (offsets floor((W' - S) / 2), floor((H' - S) / 2)).
An image whose short side is below S is refused (no upscaling); so is an unreadable, truncated or missing file.
The result is uint8 [S, S, 3]; `to_signed` turns a stack of them into float [B, 3, S, S] in [-1, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "WEBP")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


class PixelError(ValueError):
    """An image file that cannot become pixels; the message names the file."""


def read_image(path: str | Path, size: int) -> np.ndarray:
    """An image file -> uint8 [size, size, 3] (module docstring); raises PixelError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise PixelError(f"image file {path} does not exist")
    try:
        with Image.open(path) as opened:
            if opened.format not in FORMATS:
                raise PixelError(f"image file {path} is {opened.format}; expected one of {', '.join(FORMATS)}")
            opened.load()
            picture = ImageOps.exif_transpose(opened).convert("RGB")
    except UnidentifiedImageError as exc:
        raise PixelError(f"image file {path} is not a readable image ({exc})") from exc
    except OSError as exc:  # Pillow's "image file is truncated", broken data streams, ...
        raise PixelError(f"image file {path} is truncated or corrupt ({exc})") from exc
    width, height = picture.size
    if min(width, height) < size:
        raise PixelError(f"image file {path} is {width}x{height} px, smaller than the tokenizer's {size}x{size} "
                         "(images are never upscaled)")
    if min(width, height) > size:
        scale = size / min(width, height)
        width, height = max(size, round(width * scale)), max(size, round(height * scale))
        picture = picture.resize((width, height), Image.LANCZOS)
    left, top = (width - size) // 2, (height - size) // 2
    return np.array(picture.crop((left, top, left + size, top + size)), dtype=np.uint8)


def to_signed(arrays: np.ndarray | list[np.ndarray]) -> torch.Tensor:
    """uint8 [B, S, S, 3] (or a list of [S, S, 3]) -> float32 [B, 3, S, S] in [-1, 1] (x / 127.5 - 1)."""
    stacked = np.stack(arrays) if isinstance(arrays, list) else arrays
    return torch.from_numpy(np.ascontiguousarray(stacked)).permute(0, 3, 1, 2).float() / 127.5 - 1


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """float [3, H, W] in [-1, 1] -> uint8 [H, W, 3] (clamped, rounded)."""
    return ((pixels.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()


def image_files(paths: list[str | Path]) -> list[Path]:
    """Files and directories (every PNG / JPEG / WebP file below, by suffix, sorted) -> image paths, in order."""
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
