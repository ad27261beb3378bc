"""Built-in image tokenizer: a C-codebook residual vector quantiser over non-overlapping pixel patches.

Stands in for AToken on CPU: each P x P patch vector of an image [3, H, W] in [-1, 1] is quantised greedily
by C codebooks of K centroids, codebook c coding the residual of codebooks 0..c-1 -> codes [h * w, C] in
[0, K). Codebooks are fitted by seeded weighted k-means (k-means++ init, Lloyd steps) on distinct patches.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


@dataclass(frozen=True)
class RVQSettings:
    patch_size: int = 4
    codebook_size: int = 64
    num_codebooks: int = 4
    kmeans_iters: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("patch_size", "codebook_size", "num_codebooks", "kmeans_iters"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"RVQSettings.{name}={getattr(self, name)!r}: must be a positive integer")
        if self.codebook_size > 4096:
            raise ValueError(f"RVQSettings.codebook_size={self.codebook_size}: at most 4096 (the model's head size)")


DEFAULT_RVQ = RVQSettings()


def _kmeans(points: torch.Tensor, weights: torch.Tensor, k: int, iters: int, gen: torch.Generator) -> torch.Tensor:
    """Weighted k-means. points [M, D], weights [M] -> centroids [k, D] (k-means++ init, Lloyd steps)."""
    m = points.shape[0]
    centroids = torch.empty(k, points.shape[1], dtype=points.dtype)
    first = int(torch.multinomial(weights, 1, generator=gen))
    centroids[0] = points[first]
    nearest = ((points - centroids[0]) ** 2).sum(1)
    for j in range(1, k):
        mass = weights * nearest
        # fewer distinct points than centroids: repeat points (their clusters stay empty but valid)
        pick = int(torch.multinomial(mass, 1, generator=gen)) if mass.sum() > 0 else j % m
        centroids[j] = points[pick]
        nearest = torch.minimum(nearest, ((points - centroids[j]) ** 2).sum(1))
    for _ in range(iters):
        assign = torch.cdist(points, centroids).argmin(1)
        mass = torch.zeros(k, dtype=points.dtype).index_add_(0, assign, weights)
        sums = torch.zeros_like(centroids).index_add_(0, assign, points * weights[:, None])
        filled = mass > 0
        centroids[filled] = sums[filled] / mass[filled, None]
    return centroids


class RVQImageTokenizer:
    """codebooks [C, K, 3 * P * P] float32."""

    def __init__(self, codebooks: torch.Tensor, settings: RVQSettings):
        expected = (settings.num_codebooks, settings.codebook_size, 3 * settings.patch_size**2)
        if tuple(codebooks.shape) != expected:
            raise ValueError(f"codebooks has shape {list(codebooks.shape)}, expected {list(expected)} for {settings}")
        self.codebooks = codebooks.float().contiguous()
        self.settings = settings  # frozen: its sizes are copied once
        self.patch_size, self.num_codebooks = settings.patch_size, settings.num_codebooks
        self.codebook_size = settings.codebook_size

    def _check_images(self, images: torch.Tensor) -> None:
        p = self.patch_size
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] % p or images.shape[3] % p:
            raise ValueError(f"images has shape {list(images.shape)}; expected [B, 3, H, W] with H, W multiples "
                             f"of patch_size={p}")

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, h * w, 3 * P * P] (row-major grid, each patch flattened channel-first)."""
        self._check_images(images)
        p = self.patch_size
        b, _, height, width = images.shape
        x = images.float().reshape(b, 3, height // p, p, width // p, p)
        return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (height // p) * (width // p), 3 * p * p)

    def _unpatch(self, vectors: torch.Tensor, h: int, w: int) -> torch.Tensor:
        p = self.patch_size
        b = vectors.shape[0]
        x = vectors.reshape(b, h, w, 3, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, 3, h * p, w * p)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [-1, 1] -> codes [B, (H/P) * (W/P), C] int64 (each distinct patch once)."""
        patches = self.patches(images)
        b, n, d = patches.shape
        distinct, inverse = torch.unique(patches.reshape(-1, d), dim=0, return_inverse=True)
        residual = distinct
        codes = []
        for book in self.codebooks:
            index = torch.cdist(residual, book).argmin(-1)
            residual = residual - book[index]
            codes.append(index)
        return torch.stack(codes, dim=-1)[inverse].reshape(b, n, self.num_codebooks)

    def decode(self, codes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """codes [B, h * w, C] (or [h * w, C]) -> images [B, 3, h * P, w * P] (clamped to [-1, 1])."""
        single = codes.dim() == 2
        if single:
            codes = codes[None]
        if codes.dim() != 3 or codes.shape[1] != h * w or codes.shape[2] != self.num_codebooks:
            raise ValueError(f"codes has shape {list(codes.shape)}; expected [B, h*w={h * w}, C={self.num_codebooks}]")
        if codes.dtype.is_floating_point or (codes < 0).any() or (codes >= self.codebook_size).any():
            raise ValueError(f"codes must be integers in [0, {self.codebook_size})")
        vectors = sum(self.codebooks[c][codes[..., c].long()] for c in range(self.num_codebooks))
        images = self._unpatch(vectors, h, w).clamp(-1, 1)
        return images[0:1] if single else images

    @classmethod
    def fit(cls, images: torch.Tensor, settings: RVQSettings = DEFAULT_RVQ) -> RVQImageTokenizer:
        """Fit the C codebooks on images [B, 3, H, W] in [-1, 1], deterministically from settings.seed."""
        probe = cls(torch.zeros(settings.num_codebooks, settings.codebook_size, 3 * settings.patch_size**2), settings)
        return cls.fit_vectors(probe.patches(images).reshape(-1, 3 * settings.patch_size**2), settings)

    @classmethod
    def fit_vectors(cls, vectors: torch.Tensor, settings: RVQSettings = DEFAULT_RVQ) -> RVQImageTokenizer:
        """Fit the C codebooks on patch vectors [M, 3 * P * P] (as `patches` cuts them), seeded by settings.seed."""
        gen = torch.Generator().manual_seed(settings.seed)
        points, counts = torch.unique(vectors, dim=0, return_counts=True)
        weights = counts.double()
        points = points.double()
        books = []
        for _ in range(settings.num_codebooks):
            book = _kmeans(points, weights, settings.codebook_size, settings.kmeans_iters, gen)
            points = points - book[torch.cdist(points, book).argmin(1)]
            books.append(book)
        return cls(torch.stack(books).float(), settings)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"codebooks": self.codebooks}, str(path), metadata={"settings": json.dumps(asdict(self.settings))})
        return path

    @classmethod
    def load(cls, path: str | Path) -> RVQImageTokenizer:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if "settings" not in meta:
            raise ValueError(f"{path}: not an RVQ image tokenizer file (no 'settings' metadata)")
        return cls(load_file(str(path))["codebooks"], RVQSettings(**json.loads(meta["settings"])))
