"""`ATokenTokenizer`: the official model's visual tokenizer, AToken (arXiv 2509.14476), as a `VisualTokenizer`.

AToken codes an image as 8 codebooks of 4096 codes per 16 x 16 px patch (contract sections 6.3 and 7); video
frames in temporal patches of 4. It needs its own package and weights (and in practice a GPU). This adapter is
the glue around it; the AToken model itself is not part of lumina.

Assumed call signature of the AToken module (no reference implementation of the released tokenizer was
available to check against; change `ATokenTokenizer._encode_sparse` / `.decode` if yours differs):

    module.encode(pixels: float [B, 3, T, H, W] in [-1, 1]) -> (indices int [N, 8], coords int [N, 5])
    module.decode(indices int [N, 8], coords int [N, 5]) -> pixels float [B, 3, T, H, W] in [-1, 1]

coords follow the token-file convention (contract section 7): images (batch, time, row, col, 0); videos
(batch, t, x, y, 0), token order t, y, x. The adapter accepts tokens in any order from `encode`, checks that
they cover each item's grid exactly once, and returns them in row-major order. The module is built from the
installed package as `atoken.from_pretrained(weights)`.

Without the package or the weights, `ATokenTokenizer.from_pretrained` raises one `ATokenUnavailable` error
naming what is missing.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import torch
from torch import nn

from lumina.data.tokenizers.visual import CONFIG_FILE, check_pixels, read_config

PACKAGE = "atoken"


class ATokenUnavailable(ValueError):
    """The AToken package or its weights are missing."""


class ATokenTokenizer:
    name = "atoken"
    version = 1

    def __init__(self, module: nn.Module, image_size: int = 256, weights: str = "", num_codebooks: int = 8,
                 codebook_size: int = 4096, patch_size: int = 16, temporal_patch: int = 4):
        if image_size <= 0 or image_size % patch_size:
            raise ValueError(f"image_size={image_size}: must be a positive multiple of patch_size={patch_size}")
        self.module, self.image_size, self.weights = module, image_size, str(weights)
        self.num_codebooks, self.codebook_size = num_codebooks, codebook_size
        self.patch_size, self.temporal_patch = patch_size, temporal_patch

    @classmethod
    def from_pretrained(cls, weights: str | Path, image_size: int = 256, device: str = "auto") -> ATokenTokenizer:
        """The AToken module of the installed `atoken` package with the weights at `weights`, on `device`
        ("auto": CUDA when available)."""
        missing = []
        try:
            package = importlib.import_module(PACKAGE)
        except ImportError as exc:
            package = None
            missing.append(f"the Python package {PACKAGE!r} ({exc})")
        if not Path(weights).exists():
            missing.append(f"its weights at {weights} (no such file or directory)")
        if missing:
            raise ATokenUnavailable("the AToken visual tokenizer needs " + " and ".join(missing)
                                    + "; or use the built-in tokenizer (`lumina-data fit-tokenizer`)")
        loader = getattr(package, "from_pretrained", None)
        if loader is None:
            raise ATokenUnavailable(f"the installed {PACKAGE!r} package has no from_pretrained(weights); see "
                                    "lumina/data/tokenizers/atoken.py for the assumed interface")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(loader(str(weights)).to(device).eval(), image_size, str(weights))

    @property
    def device(self) -> torch.device:
        first = next(self.module.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    @property
    def side(self) -> int:
        return self.image_size // self.patch_size

    # ---- encode ----
    def _encode_sparse(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 3, T, S, S] -> (indices [N, C] int64, coords [N, 5] int64) on the CPU."""
        with torch.no_grad():
            indices, coords = self.module.encode(pixels.to(self.device))
        indices, coords = indices.long().cpu(), coords.long().cpu()
        if indices.dim() != 2 or indices.shape[1] != self.num_codebooks or coords.dim() != 2 or \
                coords.shape != (indices.shape[0], 5):
            raise ValueError(f"AToken encode returned indices {list(indices.shape)} and coords {list(coords.shape)}; "
                             f"expected [N, {self.num_codebooks}] and [N, 5]")
        return indices, coords

    def _ordered(self, indices: torch.Tensor, coords: torch.Tensor, batch: int, axes: tuple[int, int, int],
                 grid: tuple[int, int, int]) -> torch.Tensor:
        """Item `batch`'s codes in (t, y, x) row-major order; axes = the coords columns of (t, y, x)."""
        mine = coords[:, 0] == batch
        cells = coords[mine][:, list(axes)]
        t, h, w = grid
        if ((cells < 0) | (cells >= torch.tensor(grid))).any() or cells.shape[0] != t * h * w:
            raise ValueError(f"AToken encode: item {batch} has {cells.shape[0]} tokens with coords outside or not "
                             f"covering the grid {grid}")
        flat = (cells[:, 0] * h + cells[:, 1]) * w + cells[:, 2]
        if not torch.equal(flat.sort().values, torch.arange(t * h * w)):
            raise ValueError(f"AToken encode: item {batch} does not cover its grid {grid} exactly once")
        return indices[mine][flat.argsort()]

    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """[B, 3, S, S] in [-1, 1] -> codes [B, h * w, C], grid (h, w)."""
        check_pixels(pixels, self.image_size, "pixels")
        indices, coords = self._encode_sparse(pixels[:, :, None])
        grid = (1, self.side, self.side)
        codes = [self._ordered(indices, coords, b, (1, 2, 3), grid) for b in range(pixels.shape[0])]
        return torch.stack(codes), (self.side, self.side)

    def encode_video(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[T, 3, S, S] -> codes [t * h * w, C] ordered (t, y, x), grid (ceil(T / temporal_patch), h, w)."""
        check_pixels(frames, self.image_size, "frames")
        indices, coords = self._encode_sparse(frames.permute(1, 0, 2, 3)[None])
        grid = (math.ceil(frames.shape[0] / self.temporal_patch), self.side, self.side)
        return self._ordered(indices, coords, 0, (1, 3, 2), grid), grid

    # ---- decode ----
    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[B, h * w, C] or [h * w, C] -> [B, 3, h * P, w * P] in [-1, 1]."""
        batch = codes[None] if codes.dim() == 2 else codes
        h, w = grid
        if batch.dim() != 3 or batch.shape[1:] != (h * w, self.num_codebooks):
            raise ValueError(f"codes has shape {list(codes.shape)}; expected [B, {h * w}, {self.num_codebooks}]")
        b = batch.shape[0]
        rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
        coords = torch.stack([torch.arange(b).repeat_interleave(h * w), torch.zeros(b * h * w, dtype=torch.long),
                              rows.repeat(b), cols.repeat(b), torch.zeros(b * h * w, dtype=torch.long)], dim=1)
        with torch.no_grad():
            pixels = self.module.decode(batch.reshape(-1, self.num_codebooks).to(self.device), coords.to(self.device))
        return pixels[:, :, 0].float().cpu().clamp(-1, 1)

    # ---- files ----
    def save(self, directory: str | Path) -> Path:
        """visual_tokenizer.json only: it points at the weights (never copied)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        doc = {"name": self.name, "version": self.version, "num_codebooks": self.num_codebooks,
               "codebook_size": self.codebook_size, "patch_size": self.patch_size, "image_size": self.image_size,
               "temporal_patch": self.temporal_patch, "weights": str(Path(self.weights).resolve())}
        (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str = "auto") -> ATokenTokenizer:
        doc = read_config(directory)
        return cls.from_pretrained(doc["weights"], doc["image_size"], device=device)
