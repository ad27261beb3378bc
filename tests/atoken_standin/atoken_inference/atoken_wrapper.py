"""Stand-in `ATokenWrapper` (official: atoken_inference/atoken_wrapper.py).

    ATokenWrapper(config_path, model_path)          config: yaml with model.model_cfg.arch_cfg.patch_size
                                                    (atoken_wrapper.py `_load_model`); checkpoint: a state dict
                                                    read with torch.load (atoken_wrapper.py)
    .image_video_to_sparse_tensor([media, ...])     media [H, W, 3] (an image, tools/tokenize_image.py) or
                                                    [T, H, W, 3] (a video, infer_video_sft.py), in [-1, 1];
                                                    -> SparseTensor(.feats [N, D], .coords int [N, 5])
                                                    coords [batch, t, h, w, z] (atoken_wrapper.py `forward`)
    .extract_encode(sparse) -> (indices [N, 8], coords [N, 5])       tools/tokenize_image.py
                                                    image coords (batch, 0, row, col, 0) row-major; video coords
                                                    [batch, t, x, y, z], x the width (utils/media_token_io.py),
                                                    emitted x-major here, so readers must sort
    .extract_decode(indices [N, 8], coords int32 [N, 5]) -> SparseTensor of pixel patches  infer_t2i_sft.py
The model casts inputs to its own dtype and device, as `extract_encode` does officially.
"""

from __future__ import annotations

import torch
import yaml
from torch import nn

from atoken_inference.model.basic import SparseTensor

LEVELS = 4096


class ATokenWrapper(nn.Module):
    def __init__(self, config_path, model_path):
        super().__init__()
        with open(config_path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
        self.arch_cfg = config["model"]["model_cfg"]["arch_cfg"]
        self.levels = nn.Parameter(torch.zeros(LEVELS), requires_grad=False)
        self.load_state_dict(torch.load(model_path, map_location="cpu"))

    def image_video_to_sparse_tensor(self, images, patch_size=None):
        temporal, p, _ = patch_size or self.arch_cfg["patch_size"]
        feats, coords = [], []
        for i, media in enumerate(images):
            video = media.dim() == 4
            frames = media if video else media[None]
            t = temporal if video else 1
            n, h, w, _ = frames.shape
            patches = frames.reshape(n // t, t, h // p, p, w // p, p, 3).permute(0, 2, 4, 1, 3, 5, 6)
            feats.append(patches.reshape(-1, t * p * p * 3))
            cells = torch.stack(torch.meshgrid(torch.arange(n // t), torch.arange(h // p), torch.arange(w // p),
                                               indexing="ij"), dim=-1).reshape(-1, 3)
            batch = torch.full((len(cells), 1), i)
            coords.append(torch.cat([batch, cells, torch.zeros(len(cells), 1, dtype=torch.long)], dim=1))
        return SparseTensor(feats=torch.cat(feats).to(images[0].device),
                            coords=torch.cat(coords).to(images[0].device).int())

    @torch.no_grad()
    def extract_encode(self, x):
        dtype, device = self.levels.dtype, self.levels.device
        feats = x.feats.to(device=device, dtype=dtype).float()
        means = feats.reshape(len(feats), -1, 3).mean(dim=1)  # [N, 3]
        codes = ((means + 1) / 2 * (LEVELS - 1)).round().clamp(0, LEVELS - 1).long()
        indices = torch.cat([codes, torch.zeros(len(codes), 5, dtype=torch.long, device=device)], dim=1)
        coords = x.coords.to(device).long()
        temporal, p, _ = self.arch_cfg["patch_size"]
        if feats.shape[1] == temporal * p * p * 3:  # video patches: [batch, t, h, w, z] -> [batch, t, x, y, z]
            coords = coords[:, [0, 1, 3, 2, 4]]  # listed x-major below, so readers must sort
            order = torch.argsort(coords[:, 2] * 1_000_000 + coords[:, 1] * 1000 + coords[:, 3])
            indices, coords = indices[order], coords[order]
        return indices, coords.int()

    def extract_decode(self, indices, coords):
        means = self.levels[indices[:, :3].long()].float()  # [N, 3]
        return SparseTensor(feats=means, coords=coords)
