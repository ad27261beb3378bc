"""The AToken adapter on the official wrapper's interface, run against the stand-in `atoken_inference` package
(tests/atoken_standin: 16 px patches coded by their mean colour, codebooks 0-2 = channel means on 4096 levels,
video coords [batch, t, x, y, z] emitted x-major). Expected codes are computed here from the painted colours."""

from __future__ import annotations

import json

import pytest
import torch

from lumina.tokenizers.atoken import ATokenTokenizer, ATokenUnavailable
from lumina.tokenizers.pixels import to_uint8
from lumina.tokenizers.registry import load_visual_tokenizer
from lumina.tokenizers.visual import VisualTokenizerRecord

P = 16


def painted(h: int, w: int, frames: int = 0) -> tuple[torch.Tensor, list]:
    """[3, h*16, w*16] (or [frames, 3, ...] with frames in groups of 4) where cell (t, r, c) channel k is
    -1 + n / 8, n = (t + r * w + c + k) % 17 (exact in bf16); and its expected codes [n*4095/16 rounded]."""
    groups = max(1, frames // 4)
    cells = torch.zeros(groups, 3, h, w)
    expected = []
    for t in range(groups):
        for r in range(h):
            for c in range(w):
                n = [(t + r * w + c + k) % 17 for k in range(3)]
                cells[t, :, r, c] = torch.tensor([-1 + v / 8 for v in n])
                expected.append([round(v / 16 * 4095) for v in n] + [0] * 5)
    pixels = cells.repeat_interleave(P, 2).repeat_interleave(P, 3)
    if frames:
        return pixels.repeat_interleave(4, 0), expected
    return pixels[0], expected


@pytest.fixture
def atoken(atoken_files) -> ATokenTokenizer:
    return ATokenTokenizer.from_pretrained(package_path=atoken_files["package"], device="cpu")


def test_the_wrapper_is_built_as_the_official_tool_builds_it(atoken, atoken_files):
    # config / checkpoint from ATOKEN_CONFIG_PATH / ATOKEN_MODEL_PATH; bf16, eval mode, on the device asked for
    assert (atoken.config, atoken.checkpoint) == (atoken_files["config"], atoken_files["checkpoint"])
    assert atoken.wrapper.levels.dtype == torch.bfloat16 and not atoken.wrapper.training
    assert atoken.device == torch.device("cpu")
    assert (atoken.num_codebooks, atoken.codebook_size, atoken.patch_size, atoken.image_size) == (8, 4096, 16, 1024)


def test_non_square_images_encode_row_major_and_decode_back(atoken):
    image, expected = painted(3, 5)  # 48 x 80 px
    codes, grid = atoken.encode(image[None] * torch.ones(2, 1, 1, 1))
    assert grid == (3, 5) and codes.shape == (2, 15, 8)
    assert codes[0].tolist() == expected and torch.equal(codes[0], codes[1])
    decoded = atoken.decode(codes, grid)
    assert decoded.shape == (2, 3, 48, 80)
    assert (decoded - image).abs().max() < 0.01  # the levels are bf16: 4096 levels held to ~3 significant digits


def test_videos_encode_in_groups_of_four_frames_sorted_t_y_x(atoken):
    frames, expected = painted(2, 3, frames=8)  # 8 frames of 32 x 48 px
    codes, grid = atoken.encode_video(frames)
    assert grid == (2, 2, 3) and codes.tolist() == expected  # the stand-in emits x-major: the adapter sorts
    back = atoken.decode_video(codes, grid)
    assert back.shape == (8, 3, 32, 48) and (back - frames).abs().max() < 0.01
    with pytest.raises(ValueError, match=r"frames has 6 frames; AToken codes videos in groups of 4"):
        atoken.encode_video(frames[:6])


def test_pixels_off_the_patch_grid_are_refused(atoken):
    with pytest.raises(ValueError, match=r"pixels has shape \[1, 3, 40, 48\]; .*multiples of the patch size 16"):
        atoken.encode(torch.zeros(1, 3, 40, 48))


def test_missing_package_and_files_are_named_in_one_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ATOKEN_CONFIG_PATH", raising=False)
    monkeypatch.delenv("ATOKEN_MODEL_PATH", raising=False)
    with pytest.raises(ATokenUnavailable) as err:
        ATokenTokenizer.from_pretrained(checkpoint=str(tmp_path / "atoken-sod.pt"), package_path=str(tmp_path),
                                        device="cpu")
    message = str(err.value)
    assert "atoken_inference package under package_path" in message
    assert "its config (set ATOKEN_CONFIG_PATH or pass it)" in message
    assert "atoken-sod.pt (no such file)" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_stops_unless_a_device_is_named(atoken_files):
    with pytest.raises(ATokenUnavailable, match=r"AToken runs on CUDA .*set the device explicitly"):
        ATokenTokenizer.from_pretrained(package_path=atoken_files["package"])


def test_saved_record_reloads_through_the_registry(atoken, tmp_path):
    directory = atoken.save(tmp_path / "tok")
    doc = json.loads((directory / "visual_tokenizer.json").read_text())
    assert (doc["name"], doc["config"], doc["package_path"]) == ("atoken", atoken.config, atoken.package_path)
    loaded = load_visual_tokenizer(directory, device="cpu")
    assert isinstance(loaded, ATokenTokenizer) and loaded.checkpoint == atoken.checkpoint
    record = VisualTokenizerRecord.of(atoken, directory)
    assert (record.name, record.num_codebooks, record.codebook_size, record.patch_size) == ("atoken", 8, 4096, 16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_by_default(atoken_files):
    atoken = ATokenTokenizer.from_pretrained(package_path=atoken_files["package"])  # no device: CUDA
    assert atoken.device.type == "cuda" and atoken.wrapper.levels.dtype == torch.bfloat16
    image, expected = painted(2, 3)
    codes, grid = atoken.encode(image[None])
    assert grid == (2, 3) and codes[0].tolist() == expected and codes.device.type == "cpu"
    assert (atoken.decode(codes, grid) - image).abs().max() < 0.01


def test_build_codes_video_frames_in_fours_and_names_a_video_it_cannot_code(atoken, tmp_path):
    from PIL import Image

    from lumina.contract.special_tokens import SpecialTokens
    from lumina.data.storage import ParquetSampleDataset
    from lumina.ingest.build_shards import build_shards
    from lumina.ingest.encode import PixelEncoder

    frames, expected = painted(1, 2, frames=4)  # 4 frames of 16 x 32 px: one frame group, grid (1, 1, 2)
    for i, frame in enumerate(frames):
        Image.fromarray(to_uint8(frame)).save(tmp_path / f"f{i}.png")
    rows = [{"id": n, "turns": [{"role": "user", "parts": [{"kind": "video", "files": [f"f{i}.png" for i in range(k)]},
                                                          {"kind": "text", "ids": [5]}]},
                                {"role": "assistant", "parts": [{"kind": "text", "ids": [6]}]}]}
            for n, k in (("four", 4), ("three", 3))]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_shards([tmp_path / "m.jsonl"], tmp_path / "out", SpecialTokens.official(newline=201), on_error="skip",
                          pixels=PixelEncoder(atoken, max_edge=0))
    assert report.rows_written == 1 and report.skipped[0].line == 2
    assert "parts[0].files: frames has 3 frames; AToken codes videos in groups of 4" in report.skipped[0].reason
    video = ParquetSampleDataset(tmp_path / "out")[0].turns[0].parts[0]
    assert video.grid == (1, 1, 2) and video.codes.tolist() == expected
