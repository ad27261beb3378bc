"""Stand-in `sparse_to_img_list` (official: atoken_inference/model/utils.py, called by tools/tokenize_image.py
and infer_t2i_sft.py as `sparse_to_img_list(decoded.cpu(), [4, 16, 16], task_types=["image"])`).

Per batch item: an image -> [1, 3, H, W] (coords (batch, 0, row, col, 0)); a video -> its frames [4 t, 3, H, W]
(coords [batch, t, x, y, z]). Each patch is painted with its decoded mean colour.
"""

from __future__ import annotations

import torch


def sparse_to_img_list(sparse, patch_size, task_types):
    temporal, p, _ = patch_size
    out = []
    for b, task in enumerate(task_types):
        mine = sparse.coords[:, 0] == b
        coords, means = sparse.coords[mine].long(), sparse.feats[mine].float()
        if task == "image":
            t, rows, cols = coords[:, 1], coords[:, 2], coords[:, 3]
            frames_per_t = 1
        else:
            t, rows, cols = coords[:, 1], coords[:, 3], coords[:, 2]
            frames_per_t = temporal
        h, w = int(rows.max()) + 1, int(cols.max()) + 1
        grid = torch.zeros(int(t.max()) + 1, 3, h, w)
        grid[t, :, rows, cols] = means
        pixels = grid.repeat_interleave(p, dim=2).repeat_interleave(p, dim=3)
        out.append(pixels.repeat_interleave(frames_per_t, dim=0))
    return out
