"""`lumina-data fit-tokenizer IMAGES... --out DIR`: fit the built-in residual-VQ tokenizer on your own images.

The files are read like a build reads them (`lumina.tokenizers.pixels`, long edge `image_size`; a bad file raises
naming it) by `workers` processes. A seeded round(heldout_fraction * N) of them (at least one when the
fraction is > 0 and N >= 2) is held out; the tokenizer is fitted on the rest (`fit_rvq`) and its PSNR on the
held-out images reported. Deterministic in (files in order, settings, seed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lumina.ingest.encode import FrameReader
from lumina.tokenizers.pixels import PixelError, Preparation, to_signed
from lumina.tokenizers.rvq_quantizer import RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer, fit_rvq


def heldout_indices(n: int, fraction: float, seed: int) -> list[int]:
    """Sorted indices of the held-out images among n (module docstring)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"heldout_fraction={fraction}: must lie in [0, 1)")
    count = round(fraction * n)
    if fraction > 0 and n >= 2:
        count = max(1, count)
    return sorted(torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count].tolist())


def read_images(files: list[Path], prep: Preparation, workers: int = 0) -> list[torch.Tensor]:
    """float [3, H, W] in [-1, 1] of image files, in order; the first unreadable one raises PixelError naming it."""
    with FrameReader(prep, workers) as reader:
        results = reader.submit([(f,) for f in files])()
    for result in results:
        if isinstance(result, PixelError):
            raise result
    return [to_signed(r)[0] for r in results]


def fit_on_files(files: list[Path], settings: RVQSettings, image_size: int, heldout_fraction: float = 0.1,
                 max_patches: int | None = 200_000, workers: int = 0) -> tuple[RVQVisualTokenizer, dict[str, Any]]:
    """The fitted tokenizer and its report (fit_rvq's, plus the held-out file names)."""
    if image_size % settings.patch_size:
        raise ValueError(f"image_size={image_size}: must be a multiple of patch_size={settings.patch_size}")
    images = read_images(files, Preparation(image_size, settings.patch_size), workers)
    held = heldout_indices(len(files), heldout_fraction, settings.seed)
    train = [image for i, image in enumerate(images) if i not in held]
    tokenizer, report = fit_rvq(train, [images[i] for i in held], settings, image_size, max_patches)
    report["heldout_files"] = [str(files[i]) for i in held]  # report is tokenizer.report: saved with it
    return tokenizer, report
