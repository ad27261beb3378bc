"""The AToken adapter's glue, run against a small torch module with AToken's (assumed) call signature
(`lumina/data/tokenizers/atoken.py`): encode(pixels [B, 3, T, H, W]) -> (indices [N, C], coords [N, 5]),
decode(indices, coords) -> pixels [B, 3, T, H, W]. The module codes each 16 x 16 patch of a frame by its mean
colour (codebooks 0-2: the three channels quantised to 16 levels; 3-7: zero) and returns the tokens shuffled."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lumina.data.tokenizers.atoken import ATokenTokenizer, ATokenUnavailable
from lumina.data.tokenizers.visual import VisualTokenizerRecord, load_visual_tokenizer

P = 16


class PatchMeanAToken(nn.Module):
    def __init__(self, temporal_patch: int = 1, video_xy: bool = False):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(7.5))  # a parameter, so that the adapter can find the device
        self.temporal_patch, self.video_xy = temporal_patch, video_xy

    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, _, t, h, w = pixels.shape
        frames = pixels[:, :, ::self.temporal_patch]  # a temporal patch coded by its first frame
        means = frames.reshape(b, 3, frames.shape[2], h // P, P, w // P, P).mean(dim=(4, 6))  # [B, 3, t, h', w']
        levels = ((means + 1) * self.scale).round().clamp(0, 15).long()
        grid = torch.stack(torch.meshgrid(*(torch.arange(n) for n in (b,) + tuple(levels.shape[2:])),
                                          indexing="ij"), dim=-1).reshape(-1, 4)  # (batch, t, row, col)
        codes = levels.permute(0, 2, 3, 4, 1).reshape(-1, 3)
        indices = torch.cat([codes, torch.zeros(len(codes), 5, dtype=torch.long)], dim=1)
        cols = (0, 1, 3, 2) if self.video_xy else (0, 1, 2, 3)  # video coords are (batch, t, x, y)
        coords = torch.cat([grid[:, list(cols)], torch.zeros(len(grid), 1, dtype=torch.long)], dim=1)
        order = torch.randperm(len(codes), generator=torch.Generator().manual_seed(0))
        return indices[order].int(), coords[order].int()

    def decode(self, indices: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        b, t, h, w = (int(coords[:, k].max()) + 1 for k in range(4))
        out = torch.zeros(b, 3, t, h * P, w * P)
        colours = indices[:, :3].float() / self.scale - 1
        for (bi, ti, r, c, _), colour in zip(coords.tolist(), colours, strict=True):
            out[bi, :, ti, r * P:(r + 1) * P, c * P:(c + 1) * P] = colour[:, None, None]
        return out


def blocks(count: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    """[count, 3, size, size] images of flat 16 x 16 blocks at the 16 representable levels."""
    levels = torch.randint(0, 16, (count, 3, size // P, size // P), generator=torch.Generator().manual_seed(seed))
    return (levels.float() / 7.5 - 1).repeat_interleave(P, 2).repeat_interleave(P, 3)


def test_encode_returns_row_major_codes_and_decode_inverts_it():
    adapter = ATokenTokenizer(PatchMeanAToken(), image_size=32)
    images = blocks(3)
    codes, grid = adapter.encode(images)
    assert grid == (2, 2) and codes.shape == (3, 4, 8) and codes.dtype == torch.int64
    # cell (row r, col c) of item b holds that block's three levels: row-major order despite the shuffle
    expected = ((images[:, :, ::P, ::P] + 1) * 7.5).round().long().permute(0, 2, 3, 1).reshape(3, 4, 3)
    assert torch.equal(codes[..., :3], expected) and not codes[..., 3:].any()
    assert torch.allclose(adapter.decode(codes, grid), images, atol=1e-6)
    assert torch.allclose(adapter.decode(codes[1], grid)[0], images[1], atol=1e-6)  # one [N, C] grid


def test_video_codes_are_ordered_t_y_x_from_x_y_coords():
    adapter = ATokenTokenizer(PatchMeanAToken(temporal_patch=4, video_xy=True), image_size=32)
    frames = blocks(6)
    codes, grid = adapter.encode_video(frames)
    assert grid == (2, 2, 2)  # ceil(6 / 4) temporal patches
    first_frames = frames[[0, 4]]
    expected = ((first_frames[:, :, ::P, ::P] + 1) * 7.5).round().long().permute(0, 2, 3, 1).reshape(8, 3)
    assert torch.equal(codes[:, :3], expected)


def test_tokens_that_miss_the_grid_are_refused():
    class Dropping(PatchMeanAToken):
        def encode(self, pixels):
            indices, coords = super().encode(pixels)
            return indices[1:], coords[1:]

    with pytest.raises(ValueError, match=r"item 0 has 3 tokens with coords outside or not covering the grid"):
        ATokenTokenizer(Dropping(), image_size=32).encode(blocks(1))
    with pytest.raises(ValueError, match=r"pixels has shape \[1, 3, 16, 16\]; expected \[B, 3, 32, 32\]"):
        ATokenTokenizer(PatchMeanAToken(), image_size=32).encode(blocks(1, size=16))


def test_missing_package_and_weights_raise_one_error_naming_both(tmp_path):
    with pytest.raises(ATokenUnavailable, match=r"needs the Python package 'atoken' \(No module named 'atoken'\) "
                                                r"and its weights at /nowhere/atoken.pt \(no such file"):
        ATokenTokenizer.from_pretrained("/nowhere/atoken.pt")
    weights = tmp_path / "atoken.pt"
    weights.write_bytes(b"")
    with pytest.raises(ATokenUnavailable) as caught:
        ATokenTokenizer.from_pretrained(weights)
    assert "'atoken'" in str(caught.value) and "weights" not in str(caught.value)


def test_a_saved_adapter_records_itself_and_reloads_through_the_package(tmp_path):
    adapter = ATokenTokenizer(PatchMeanAToken(), image_size=64, weights=str(tmp_path / "w.pt"))
    directory = adapter.save(tmp_path / "tok")
    doc = json.loads((directory / "visual_tokenizer.json").read_text())
    assert (doc["name"], doc["num_codebooks"], doc["codebook_size"], doc["patch_size"], doc["image_size"]) == \
        ("atoken", 8, 4096, 16, 64)
    record = VisualTokenizerRecord.of(adapter, directory)
    assert (record.name, record.num_codebooks, record.codebook_size) == ("atoken", 8, 4096)
    with pytest.raises(ATokenUnavailable, match="needs the Python package 'atoken'"):
        load_visual_tokenizer(directory)  # dispatches on the saved name
