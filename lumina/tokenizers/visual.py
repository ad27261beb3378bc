"""`VisualTokenizer`: pixels <-> code grids, and the record a dataset keeps of the tokenizer that made it.

A visual tokenizer works on images of any aspect ratio, H x W px with H and W multiples of `patch_size` P:
    encode(pixels [B, 3, H, W] in [-1, 1])   -> codes [B, h * w, C] int64 in [0, K), grid (h, w) = (H/P, W/P)
    encode_video(frames [T, 3, H, W])        -> codes [t * h * w, C] (ordered t, y, x), grid (t, h, w)
    decode(codes [B, h * w, C] or [h * w, C], grid (h, w)) -> pixels [B, 3, h * P, w * P] in [-1, 1]
`image_size`: the default long edge of image files (the built-in one's fitting size, AToken's 1024). On disk
a tokenizer is a directory holding `visual_tokenizer.json` (+ the built-in one's weights file); a dataset
keeps a copy beside its shards and records its `VisualTokenizerRecord` in every shard.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch

CONFIG_FILE = "visual_tokenizer.json"


class VisualTokenizer(Protocol):
    name: str
    version: int
    num_codebooks: int
    codebook_size: int
    patch_size: int
    image_size: int

    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def encode_video(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]: ...

    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor: ...

    def save(self, directory: str | Path) -> Path: ...


def check_pixels(pixels: torch.Tensor, patch_size: int, what: str) -> tuple[int, int]:
    """The grid (H / P, W / P) of pixels [B, 3, H, W]; ValueError naming `what` unless H, W are positive
    multiples of P."""
    p = patch_size
    if pixels.dim() != 4 or pixels.shape[1] != 3 or pixels.shape[2] < p or pixels.shape[3] < p or \
            pixels.shape[2] % p or pixels.shape[3] % p:
        raise ValueError(f"{what} has shape {list(pixels.shape)}; expected [B, 3, H, W] with H and W positive "
                         f"multiples of the patch size {p}")
    return pixels.shape[2] // p, pixels.shape[3] // p


def directory_fingerprint(directory: str | Path) -> str:
    """sha256 (16 hex digits) of a saved tokenizer's visual_tokenizer.json and its "weights" file, if any."""
    digest = hashlib.sha256((Path(directory) / CONFIG_FILE).read_bytes())
    weights = Path(directory) / str(read_config(directory).get("weights", ""))
    if weights.is_file() and weights.parent.resolve() == Path(directory).resolve():
        digest.update(weights.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class VisualTokenizerRecord:
    """What a dataset records of its visual tokenizer; `path` is relative to the shard inside its metadata."""

    name: str
    version: int
    num_codebooks: int
    codebook_size: int
    patch_size: int
    image_size: int
    path: str
    fingerprint: str

    @classmethod
    def of(cls, tokenizer: VisualTokenizer, directory: str | Path) -> VisualTokenizerRecord:
        """The record of `tokenizer` saved in `directory`."""
        return cls(tokenizer.name, tokenizer.version, tokenizer.num_codebooks, tokenizer.codebook_size,
                   tokenizer.patch_size, tokenizer.image_size, str(directory), directory_fingerprint(directory))

    @classmethod
    def from_json(cls, doc: Any, where: str) -> VisualTokenizerRecord:
        names = [f.name for f in fields(cls)]
        if not isinstance(doc, dict) or sorted(doc) != sorted(names):
            got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{where}: visual tokenizer record has keys {got}, expected {sorted(names)}")
        return cls(**doc)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.name} v{self.version} ({self.num_codebooks} codebooks of {self.codebook_size} codes, "
                f"patch {self.patch_size}, {self.image_size} px, fingerprint {self.fingerprint}) at {self.path}")


def check_fits_model(tokenizer: VisualTokenizer | VisualTokenizerRecord, num_codebooks: int, codebook_size: int,
                     where: str) -> None:
    """The model must predict exactly the tokenizer's codes: C and K equal; raises naming both values."""
    if (tokenizer.num_codebooks, tokenizer.codebook_size) != (num_codebooks, codebook_size):
        raise ValueError(f"{where}: the visual tokenizer {tokenizer.name} has num_codebooks="
                         f"{tokenizer.num_codebooks}, codebook_size={tokenizer.codebook_size}; the model has "
                         f"num_codebooks={num_codebooks}, codebook_size={codebook_size} (they must match)")


def read_config(directory: str | Path) -> dict[str, Any]:
    """The `visual_tokenizer.json` of a saved tokenizer directory."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"visual tokenizer {directory}: no {CONFIG_FILE} there (expected a directory "
                                "written by `lumina-data fit-tokenizer` or `build`)")
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or "name" not in doc:
        raise ValueError(f"{path}: expected a JSON object with a 'name'")
    return doc


def check_unchanged(record: VisualTokenizerRecord) -> None:
    """Raises if the files at `record.path` are not the ones recorded (compares fingerprints; loads nothing)."""
    found = directory_fingerprint(record.path)
    if found != record.fingerprint:
        raise ValueError(f"visual tokenizer at {record.path} changed since the data was built: recorded "
                         f"fingerprint {record.fingerprint}, the files there have {found}")

