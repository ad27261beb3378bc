"""Reading image files as the official tools/tokenize_image.py and infer_mmu_sft.py do: formats, RGB, the
long edge resized (or not), the centre crop to patch multiples, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from pixel_helpers import write_truncated_png

from lumina.tokenizers.pixels import PixelError, Preparation, read_image, to_signed, to_uint8


def gradient(height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] whose every pixel is distinct enough to show where it came from."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([y * 7 % 256, x * 5 % 256, (y + x) * 3 % 256], axis=-1).astype(np.uint8)


def test_without_max_edge_only_the_centre_crop_to_patch_multiples(tmp_path):
    pixels = gradient(18, 27)  # patch 4: 16 x 24, offsets floor(2 / 2) = 1 and floor(3 / 2) = 1
    Image.fromarray(pixels).save(tmp_path / "odd.png")
    assert np.array_equal(read_image(tmp_path / "odd.png", Preparation(0, 4)), pixels[1:17, 1:25])


def test_the_long_edge_is_resized_down_keeping_the_aspect_ratio(tmp_path):
    # left half red, right half blue, 64 x 128 at max_edge 32: 16 x 32, nothing to crop
    pixels = np.zeros((64, 128, 3), np.uint8)
    pixels[:, :64] = (255, 0, 0)
    pixels[:, 64:] = (0, 0, 255)
    Image.fromarray(pixels).save(tmp_path / "halves.png")
    out = read_image(tmp_path / "halves.png", Preparation(32, 4))
    assert out.shape == (16, 32, 3)
    assert (out[:, :12] == (255, 0, 0)).all() and (out[:, 20:] == (0, 0, 255)).all()  # LANCZOS rings at 16
    Image.fromarray(pixels.transpose(1, 0, 2)).save(tmp_path / "tall.png")
    assert read_image(tmp_path / "tall.png", Preparation(32, 4)).shape == (32, 16, 3)


def test_small_images_are_scaled_up_unless_max_edge_is_a_ceiling(tmp_path):
    Image.fromarray(gradient(12, 20)).save(tmp_path / "small.png")
    assert read_image(tmp_path / "small.png", Preparation(40, 8)).shape == (24, 40, 3)  # 24 x 40: no crop
    kept = read_image(tmp_path / "small.png", Preparation(40, 4, upscale=False))
    assert np.array_equal(kept, gradient(12, 20))  # infer_mmu_sft.py --input_no_upscale
    assert read_image(tmp_path / "small.png", Preparation(10, 4, upscale=False)).shape == (4, 8, 3)  # 6 x 10


def test_rounding_and_crop_of_an_odd_size(tmp_path):
    # 53 x 37 px at max_edge 24: round(37 * 24 / 53) = round(16.75) = 17 rows, 24 columns; patch 8 -> 16 x 24,
    # the row offset floor((17 - 16) / 2) = 0
    picture = Image.fromarray(gradient(37, 53))
    picture.save(tmp_path / "odd.png")
    expected = np.asarray(picture.resize((24, 17), Image.LANCZOS))[0:16]
    assert np.array_equal(read_image(tmp_path / "odd.png", Preparation(24, 8)), expected)


@pytest.mark.parametrize("fmt, suffix, options", [("PNG", ".png", {}), ("WEBP", ".webp", {"lossless": True}),
                                                  ("JPEG", ".jpg", {"quality": 95}), ("BMP", ".bmp", {})])
def test_png_webp_and_jpeg_are_read(tmp_path, fmt, suffix, options):
    pixels = gradient(24, 24)
    Image.fromarray(pixels).save(tmp_path / f"a{suffix}", format=fmt, **options)
    out = read_image(tmp_path / f"a{suffix}", Preparation(24, 4))
    if fmt == "JPEG":  # lossy: close, not equal
        assert np.abs(out.astype(int) - pixels.astype(int)).mean() < 5
    else:
        assert np.array_equal(out, pixels)


def test_exif_orientation_is_not_applied_as_in_the_official_tools(tmp_path):
    stored = gradient(16, 24)  # as the sensor stored it: 24 wide, 16 high, tagged "rotate 90 CW to display"
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(tmp_path / "phone.png", exif=exif)
    assert np.array_equal(read_image(tmp_path / "phone.png", Preparation(0, 4)), stored)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA"])
def test_other_modes_become_rgb(tmp_path, mode):
    rgb = gradient(16, 16)
    Image.fromarray(rgb).convert(mode).save(tmp_path / "m.png")
    expected = np.asarray(Image.fromarray(rgb).convert(mode).convert("RGB"))
    out = read_image(tmp_path / "m.png", Preparation(16, 4))
    assert out.shape == (16, 16, 3) and np.array_equal(out, expected)
    if mode == "RGBA":  # alpha dropped: the colours are the RGB ones
        assert np.array_equal(out, rgb)


def test_bad_files_are_refused_naming_the_file(tmp_path):
    Image.fromarray(gradient(16, 16)).save(tmp_path / "anim.gif")
    (tmp_path / "notes.png").write_text("not an image at all")
    Image.fromarray(gradient(40, 3)).save(tmp_path / "small.png")
    cases = {
        tmp_path / "nope.png": r"image file .*nope.png does not exist",
        tmp_path / "anim.gif": r"image file .*anim.gif is GIF; expected one of PNG, JPEG, WEBP",
        tmp_path / "notes.png": r"image file .*notes.png is not a readable image",
        write_truncated_png(tmp_path / "cut.png"): r"image file .*cut.png is truncated or corrupt",
        tmp_path / "small.png": r"image file .*small.png is 3x40 px, 2x32 after resizing \(max_edge=32\): a side "
                                r"is under one 4 px patch",
    }
    for path, pattern in cases.items():
        with pytest.raises(PixelError, match=pattern):
            read_image(path, Preparation(32, 4))


def test_signed_pixels_round_trip():
    arrays = np.stack([gradient(8, 8), 255 - gradient(8, 8)])
    signed = to_signed(arrays)
    assert signed.shape == (2, 3, 8, 8) and float(signed.min()) >= -1 and float(signed.max()) <= 1
    assert float(signed[0, 0, 0, 0]) == -1.0 and float(signed[1, 0, 0, 0]) == 1.0
    assert np.array_equal(to_uint8(signed[1]), arrays[1])
