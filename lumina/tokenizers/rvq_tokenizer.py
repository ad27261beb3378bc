"""The built-in residual-VQ image tokenizer as a `VisualTokenizer`, fitted on your own images.

    tokenizer, report = fit_rvq(train_images, heldout_images, RVQSettings(...), image_size, max_patches=200_000)
    tokenizer.save("tok/")            # tok/visual_tokenizer.json + tok/rvq.safetensors

Fitting is seeded: the patch vectors of the training images (a seeded sample of `max_patches` when there are
more) go through `RVQImageTokenizer.fit_vectors`; the report gives the PSNR of decode(encode(x)) on held-out
images (`psnr`). `image_size` is the long edge the fitting images were resized to. Videos are coded frame by
frame (grid t = the number of frames).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer, RVQSettings
from lumina.tokenizers.visual import CONFIG_FILE, check_pixels, read_config

WEIGHTS_FILE = "rvq.safetensors"


def psnr(reconstruction: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR in dB of images in [-1, 1] (peak-to-peak 2), MSE pooled over every value; inf when equal."""
    mse = float(((reconstruction.float() - reference.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(4.0 / mse)


class RVQVisualTokenizer:
    """An `RVQImageTokenizer` on images of H x W px (multiples of its patch); image_size: the default long edge."""

    name = "rvq"
    version = 1

    def __init__(self, rvq: RVQImageTokenizer, image_size: int, report: dict[str, Any] | None = None):
        if not isinstance(image_size, int) or image_size <= 0 or image_size % rvq.patch_size:
            raise ValueError(f"image_size={image_size!r}: must be a positive multiple of patch_size={rvq.patch_size}")
        self.rvq, self.image_size, self.report = rvq, image_size, dict(report or {})
        self.num_codebooks, self.codebook_size = rvq.num_codebooks, rvq.codebook_size
        self.patch_size = rvq.patch_size

    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """[B, 3, H, W] in [-1, 1] -> codes [B, h * w, C], grid (h, w) = (H / P, W / P)."""
        grid = check_pixels(pixels, self.patch_size, "pixels")
        return self.rvq.encode(pixels), grid

    def encode_video(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[T, 3, H, W] -> codes [T * h * w, C] ordered (t, y, x), grid (T, h, w)."""
        h, w = check_pixels(frames, self.patch_size, "frames")
        return self.rvq.encode(frames).reshape(-1, self.num_codebooks), (frames.shape[0], h, w)

    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[B, h * w, C] or [h * w, C] -> [B, 3, h * P, w * P] in [-1, 1]."""
        return self.rvq.decode(codes, *grid)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.rvq.save(directory / WEIGHTS_FILE)
        doc = {"name": self.name, "version": self.version, "num_codebooks": self.num_codebooks,
               "codebook_size": self.codebook_size, "patch_size": self.patch_size, "image_size": self.image_size,
               "weights": WEIGHTS_FILE, "settings": asdict(self.rvq.settings), "report": self.report}
        (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> RVQVisualTokenizer:
        doc = read_config(directory)
        if doc["name"] != cls.name or doc.get("version") != cls.version:
            raise ValueError(f"{Path(directory) / CONFIG_FILE}: name={doc['name']!r} version={doc.get('version')!r}, "
                             f"expected {cls.name!r} version {cls.version}")
        rvq = RVQImageTokenizer.load(Path(directory) / doc["weights"])
        return cls(rvq, doc["image_size"], doc.get("report"))


def patch_sample(images: list[torch.Tensor], patch_size: int, max_patches: int | None, seed: int) -> torch.Tensor:
    """Patch vectors [M, 3 * P * P] of images [3, H, W] (any sizes), at most a seeded `max_patches`."""
    probe = RVQImageTokenizer(torch.zeros(1, 1, 3 * patch_size**2), RVQSettings(patch_size, 1, 1))
    vectors = torch.cat([probe.patches(image[None])[0] for image in images])
    if max_patches is not None and vectors.shape[0] > max_patches:
        pick = torch.randperm(vectors.shape[0], generator=torch.Generator().manual_seed(seed))[:max_patches]
        vectors = vectors[pick.sort().values]
    return vectors


def fit_rvq(train: list[torch.Tensor], heldout: list[torch.Tensor], settings: RVQSettings, image_size: int,
            max_patches: int | None = None) -> tuple[RVQVisualTokenizer, dict[str, Any]]:
    """Fit on train images [3, H, W] in [-1, 1] read at long edge image_size; report {train_images,
    heldout_images, patches, heldout_psnr_db, train_psnr_db} (PSNR over all pixels; None: no images)."""
    if not train:
        raise ValueError("no training images to fit the tokenizer on")
    vectors = patch_sample(train, settings.patch_size, max_patches, settings.seed)
    tokenizer = RVQVisualTokenizer(RVQImageTokenizer.fit_vectors(vectors, settings), image_size)

    def round_trip(images: list[torch.Tensor]) -> float | None:
        if not images:
            return None
        decoded = [tokenizer.decode(*tokenizer.encode(image[None]))[0] for image in images]
        return psnr(torch.cat([d.flatten() for d in decoded]), torch.cat([i.flatten() for i in images]))

    report = {"train_images": len(train), "heldout_images": len(heldout), "patches": int(vectors.shape[0]),
              "heldout_psnr_db": round_trip(heldout), "train_psnr_db": round_trip(train)}
    tokenizer.report = report
    return tokenizer, report
