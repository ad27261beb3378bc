"""`ATokenTokenizer`: the released model's visual tokenizer, AToken, driven as the official InternLumina-U2 code
drives it (8 codebooks of 4096 codes per 16 x 16 px patch; videos in temporal patches of 4 frames).

AToken is the `atoken_inference` package of the user's official checkout (on PYTHONPATH, or `package_path`),
with config and checkpoint from the arguments or $ATOKEN_CONFIG_PATH / $ATOKEN_MODEL_PATH; without them
`from_pretrained` raises one `ATokenUnavailable` naming everything missing.

The calls and tensor conventions, with the official file each comes from:
    ATokenWrapper(config_path, model_path).cuda().to(torch.bfloat16).eval()    tools/tokenize_image.py
    wrapper.image_video_to_sparse_tensor([image [H, W, 3] float in [-1, 1]])     tools/tokenize_image.py
    wrapper.image_video_to_sparse_tensor([frames [T, H, W, 3]]), T % 4 == 0      infer_video_sft.py
        -> a sparse tensor with .feats and .coords [batch, t, h, w, z]            atoken_inference/atoken_wrapper.py
    wrapper.extract_encode(sparse) -> (indices [N, 8], coords [N, 5] as `lumina.tokenizers.token_files` reads them)
    wrapper.extract_decode(indices [N, 8], coords [N, 5] int32)                   infer_t2i_sft.py
        image coords written (0, 0, row, col, 0), row-major                        infer_t2i_sft.py
    atoken_inference.model.utils.sparse_to_img_list(decoded.cpu(), [4, 16, 16], task_types=["image"])[0]
        -> [1, 3, H, W] in [-1, 1]                                                 tools/tokenize_image.py
Each image is encoded and decoded in its own call, as the official scripts do. Unconfirmed without the
weights: that `sparse_to_img_list(..., task_types=["video"])[0]` gives frames [T, 3, H, W] (`decode_video`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from lumina.tokenizers.token_files import ATOKEN_CODES, TokenFileError, grid_order, image_coords
from lumina.tokenizers.visual import CONFIG_FILE, check_pixels, read_config

PACKAGE = "atoken_inference"
CONFIG_ENV, MODEL_ENV = "ATOKEN_CONFIG_PATH", "ATOKEN_MODEL_PATH"
PATCH, TEMPORAL_PATCH = 16, 4
DEFAULT_MAX_EDGE = 1024  # tools/tokenize_image.py --max_edge


class ATokenUnavailable(ValueError):
    """The atoken_inference package, its config or its checkpoint is missing, or CUDA is."""


def _resolve_device(device: str | None) -> torch.device:
    """None / "auto": CUDA, refused without it; anything else as given."""
    if device in (None, "auto"):
        if not torch.cuda.is_available():
            raise ATokenUnavailable("AToken runs on CUDA and no CUDA device is available; set the device "
                                    "explicitly (e.g. device=cpu) to run it elsewhere")
        return torch.device("cuda")
    return torch.device(device)


class ATokenTokenizer:
    """A `VisualTokenizer` over an official `ATokenWrapper` (module docstring)."""

    name = "atoken"
    version = 2
    (num_codebooks, codebook_size), patch_size, temporal_patch = ATOKEN_CODES, PATCH, TEMPORAL_PATCH

    def __init__(self, wrapper: Any, sparse_to_img_list: Any, config: str, checkpoint: str,
                 package_path: str | None = None, image_size: int = DEFAULT_MAX_EDGE):
        if not isinstance(image_size, int) or image_size < PATCH:
            raise ValueError(f"image_size={image_size!r}: the default long edge must be an integer >= {PATCH}")
        self.wrapper, self.sparse_to_img_list = wrapper, sparse_to_img_list
        self.config, self.checkpoint, self.package_path = config, checkpoint, package_path
        self.image_size = image_size

    @classmethod
    def from_pretrained(cls, config: str | None = None, checkpoint: str | None = None,
                        package_path: str | None = None, device: str | None = None,
                        image_size: int = DEFAULT_MAX_EDGE) -> ATokenTokenizer:
        """The official wrapper on `device` (None: CUDA), bf16, eval mode (files: module docstring)."""
        config = config or os.environ.get(CONFIG_ENV)
        checkpoint = checkpoint or os.environ.get(MODEL_ENV)
        missing = []
        if package_path is not None:
            root = str(Path(package_path).resolve())
            if not (Path(root) / PACKAGE).is_dir():
                missing.append(f"the {PACKAGE} package under package_path={package_path} (no {PACKAGE}/ there)")
            elif root not in sys.path:
                sys.path.insert(0, root)
        try:
            wrapper_module = importlib.import_module(f"{PACKAGE}.atoken_wrapper")
            utils_module = importlib.import_module(f"{PACKAGE}.model.utils")
        except ImportError as exc:
            wrapper_module = utils_module = None
            if not missing:
                missing.append(f"the Python package {PACKAGE} from the official InternLumina-U2 checkout ({exc}; "
                               "put the checkout on PYTHONPATH or pass its path)")
        for what, path, env in (("config", config, CONFIG_ENV), ("checkpoint", checkpoint, MODEL_ENV)):
            if not path:
                missing.append(f"its {what} (set {env} or pass it)")
            elif not Path(path).is_file():
                missing.append(f"its {what} {path} (no such file)")
        if missing:
            raise ATokenUnavailable("the AToken visual tokenizer needs " + "; ".join(missing))
        target = _resolve_device(device)
        wrapper = wrapper_module.ATokenWrapper(config, checkpoint).to(target).to(torch.bfloat16).eval()
        return cls(wrapper, utils_module.sparse_to_img_list, str(Path(config).resolve()),
                   str(Path(checkpoint).resolve()), None if package_path is None else str(Path(package_path).resolve()),
                   image_size)

    @property
    def device(self) -> torch.device:
        return next(self.wrapper.parameters()).device

    def _extract(self, media: torch.Tensor, kind: str, grid: tuple[int, ...], where: str) -> torch.Tensor:
        """One image [H, W, 3] / video [T, H, W, 3] in [-1, 1] -> codes [N, 8] int64 in grid order."""
        with torch.inference_mode():
            sparse = self.wrapper.image_video_to_sparse_tensor([media.float().to(self.device)])
            indices, coords = self.wrapper.extract_encode(sparse)
        indices, coords = indices.long().cpu(), coords.long().cpu()
        if indices.dim() != 2 or indices.shape[1] != self.num_codebooks or coords.dim() != 2 or \
                coords.shape != (indices.shape[0], 5):
            raise ValueError(f"AToken extract_encode of {where} returned indices {list(indices.shape)} and coords "
                             f"{list(coords.shape)}; expected [N, {self.num_codebooks}] and [N, 5]")
        try:
            order, found = grid_order(coords, kind, f"AToken extract_encode of {where}")
        except TokenFileError as exc:
            raise ValueError(str(exc)) from exc
        if found != grid:
            raise ValueError(f"AToken extract_encode of {where}: coords span the grid {found}, expected {grid}")
        return indices[order]

    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """[B, 3, H, W] in [-1, 1] -> codes [B, h * w, 8], grid (h, w) = (H / 16, W / 16)."""
        grid = check_pixels(pixels, self.patch_size, "pixels")
        codes = [self._extract(pixels[b].permute(1, 2, 0), "image", grid, f"pixels[{b}]")
                 for b in range(pixels.shape[0])]
        return torch.stack(codes), grid

    def encode_video(self, frames: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[T, 3, H, W] (T a multiple of 4) -> codes [t * h * w, 8] ordered (t, y, x), grid (T / 4, h, w)."""
        h, w = check_pixels(frames, self.patch_size, "frames")
        if frames.shape[0] % self.temporal_patch:
            raise ValueError(f"frames has {frames.shape[0]} frames; AToken codes videos in groups of "
                             f"{self.temporal_patch} (give a multiple of {self.temporal_patch})")
        grid = (frames.shape[0] // self.temporal_patch, h, w)
        return self._extract(frames.permute(0, 2, 3, 1), "video", grid, "frames"), grid

    def _reconstruct(self, codes: torch.Tensor, coords: torch.Tensor, task: str) -> torch.Tensor:
        with torch.inference_mode():
            decoded = self.wrapper.extract_decode(codes.long().to(self.device), coords.to(self.device, torch.int32))
            return self.sparse_to_img_list(decoded.cpu(), [self.temporal_patch, PATCH, PATCH],
                                           task_types=[task])[0].float().clamp(-1, 1)

    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """[B, h * w, 8] or [h * w, 8] -> [B, 3, h * 16, w * 16] in [-1, 1]."""
        batch = codes[None] if codes.dim() == 2 else codes
        h, w = grid
        if batch.dim() != 3 or batch.shape[1:] != (h * w, self.num_codebooks):
            raise ValueError(f"codes has shape {list(codes.shape)}; expected [B, {h * w}, {self.num_codebooks}]")
        images = [self._reconstruct(item, image_coords(grid), "image") for item in batch]
        expected = (1, 3, h * PATCH, w * PATCH)
        if any(tuple(i.shape) != expected for i in images):
            raise ValueError(f"AToken sparse_to_img_list gave {[list(i.shape) for i in images]}; expected "
                             f"{list(expected)} per image")
        return torch.cat(images)

    def decode_video(self, codes: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """[t * h * w, 8] ordered (t, y, x) -> frames [4 t, 3, h * 16, w * 16] in [-1, 1]."""
        t, h, w = grid
        if codes.dim() != 2 or codes.shape != (t * h * w, self.num_codebooks):
            raise ValueError(f"codes has shape {list(codes.shape)}; expected [{t * h * w}, {self.num_codebooks}]")
        cells = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"),
                            dim=-1).reshape(-1, 3)
        zeros = torch.zeros(len(cells), dtype=torch.long)
        coords = torch.stack([zeros, cells[:, 0], cells[:, 2], cells[:, 1], zeros], dim=1)  # [batch, t, x, y, z]
        frames = self._reconstruct(codes, coords, "video")
        expected = (t * self.temporal_patch, 3, h * PATCH, w * PATCH)
        if tuple(frames.shape) != expected:
            raise ValueError(f"AToken sparse_to_img_list gave {list(frames.shape)}; expected {list(expected)}")
        return frames

    def save(self, directory: str | Path) -> Path:
        """visual_tokenizer.json only: it points at the official package, config and checkpoint (never copied)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        doc = {"name": self.name, "version": self.version, "num_codebooks": self.num_codebooks,
               "codebook_size": self.codebook_size, "patch_size": self.patch_size, "image_size": self.image_size,
               "temporal_patch": self.temporal_patch, "config": self.config, "checkpoint": self.checkpoint,
               "package_path": self.package_path}
        (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None) -> ATokenTokenizer:
        doc = read_config(directory)
        if doc.get("version") != cls.version:
            raise ValueError(f"{Path(directory) / CONFIG_FILE}: AToken record version {doc.get('version')!r}, "
                             f"expected {cls.version}")
        return cls.from_pretrained(doc["config"], doc["checkpoint"], doc.get("package_path"), device,
                                   doc["image_size"])
