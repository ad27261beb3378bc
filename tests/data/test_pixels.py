"""Reading image files for a visual tokenizer: formats, EXIF orientation, RGB, resize/crop, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from pixel_helpers import write_truncated_png

from lumina.data.pixels import PixelError, read_image, to_signed, to_uint8


def gradient(height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] whose every pixel is distinct enough to show where it came from."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([y * 7 % 256, x * 5 % 256, (y + x) * 3 % 256], axis=-1).astype(np.uint8)


def test_short_side_at_size_is_only_centre_cropped(tmp_path):
    pixels = gradient(16, 27)  # width 27: crop offset floor((27 - 16) / 2) = 5
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    assert np.array_equal(read_image(tmp_path / "wide.png", 16), pixels[:, 5:21])
    Image.fromarray(pixels.transpose(1, 0, 2)).save(tmp_path / "tall.png")
    assert np.array_equal(read_image(tmp_path / "tall.png", 16), pixels.transpose(1, 0, 2)[5:21])


def test_larger_images_are_resized_by_the_short_side(tmp_path):
    # left half red, right half blue, 64 x 128: short side 64 -> 32, so 32 x 64, then the centre 32 columns
    pixels = np.zeros((64, 128, 3), np.uint8)
    pixels[:, :64] = (255, 0, 0)
    pixels[:, 64:] = (0, 0, 255)
    Image.fromarray(pixels).save(tmp_path / "halves.png")
    out = read_image(tmp_path / "halves.png", 32)
    assert out.shape == (32, 32, 3)
    assert (out[:, :12] == (255, 0, 0)).all() and (out[:, 20:] == (0, 0, 255)).all()  # centre columns 16..48


@pytest.mark.parametrize("fmt, suffix, options", [("PNG", ".png", {}), ("WEBP", ".webp", {"lossless": True}),
                                                  ("JPEG", ".jpg", {"quality": 95})])
def test_png_webp_and_jpeg_are_read(tmp_path, fmt, suffix, options):
    pixels = gradient(24, 24)
    Image.fromarray(pixels).save(tmp_path / f"a{suffix}", format=fmt, **options)
    out = read_image(tmp_path / f"a{suffix}", 24)
    if fmt == "JPEG":  # lossy: close, not equal
        assert np.abs(out.astype(int) - pixels.astype(int)).mean() < 5
    else:
        assert np.array_equal(out, pixels)


def test_exif_orientation_is_applied(tmp_path):
    stored = gradient(16, 24)  # as the sensor stored it: 24 wide, 16 high
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the upright picture is 16 wide, 24 high
    image.save(tmp_path / "phone.png", exif=exif)
    upright = np.rot90(stored, k=-1)  # 90 degrees clockwise
    assert upright.shape == (24, 16, 3)
    assert np.array_equal(read_image(tmp_path / "phone.png", 16), upright[4:20])


@pytest.mark.parametrize("mode", ["L", "P", "RGBA"])
def test_other_modes_become_rgb(tmp_path, mode):
    rgb = gradient(16, 16)
    Image.fromarray(rgb).convert(mode).save(tmp_path / "m.png")
    expected = np.asarray(Image.fromarray(rgb).convert(mode).convert("RGB"))
    out = read_image(tmp_path / "m.png", 16)
    assert out.shape == (16, 16, 3) and np.array_equal(out, expected)
    if mode == "RGBA":  # alpha dropped: the colours are the RGB ones
        assert np.array_equal(out, rgb)


def test_bad_files_are_refused_naming_the_file(tmp_path):
    Image.fromarray(gradient(16, 16)).save(tmp_path / "anim.gif")
    (tmp_path / "notes.png").write_text("not an image at all")
    Image.fromarray(gradient(20, 40)).save(tmp_path / "small.png")
    cases = {
        tmp_path / "nope.png": r"image file .*nope.png does not exist",
        tmp_path / "anim.gif": r"image file .*anim.gif is GIF; expected one of PNG, JPEG, WEBP",
        tmp_path / "notes.png": r"image file .*notes.png is not a readable image",
        write_truncated_png(tmp_path / "cut.png"): r"image file .*cut.png is truncated or corrupt",
        tmp_path / "small.png": r"image file .*small.png is 40x20 px, smaller than the tokenizer's 32x32",
    }
    for path, pattern in cases.items():
        with pytest.raises(PixelError, match=pattern):
            read_image(path, 32)


def test_signed_pixels_round_trip():
    arrays = np.stack([gradient(8, 8), 255 - gradient(8, 8)])
    signed = to_signed(arrays)
    assert signed.shape == (2, 3, 8, 8) and float(signed.min()) >= -1 and float(signed.max()) <= 1
    assert float(signed[0, 0, 0, 0]) == -1.0 and float(signed[1, 0, 0, 0]) == 1.0
    assert np.array_equal(to_uint8(signed[1]), arrays[1])
