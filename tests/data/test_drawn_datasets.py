"""experiments/own_data/drawn.py: the own-data recipe's drawn imagefolders are seeded, balanced, captioned by
one template per kind, and read by `lumina-data build --imagefolder`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).parents[2] / "experiments" / "own_data"))
import drawn  # noqa: E402


@pytest.mark.parametrize("kind", ["glyphs", "letters", "shapes", "figures"])
def test_a_drawn_dataset_is_seeded_balanced_and_one_template(kind, tmp_path):
    lines = drawn.write_dataset(kind, tmp_path / "a", count=40, size=24, seed=5)
    again = drawn.write_dataset(kind, tmp_path / "b", count=40, size=24, seed=5)
    drawn.write_dataset(kind, tmp_path / "c", count=40, size=24, seed=6)
    read = [json.loads(line) for line in (tmp_path / "a" / "metadata.jsonl").read_text().splitlines()]
    assert read == lines == again
    pixels = [np.asarray(Image.open(tmp_path / d / line["file_name"])) for d in "abc" for line in lines[:10]]
    assert all(p.shape == (24, 24) for p in pixels)
    assert all((a == b).all() for a, b in zip(pixels[:10], pixels[10:20], strict=True))  # same seed
    assert not any((a == c).all() for a, c in zip(pixels[:10], pixels[20:], strict=True))  # another seed
    assert [line["label"] for line in lines] == [i % 10 for i in range(40)]
    template = drawn.TEMPLATES[kind]
    assert {line["text"] for line in lines} == {template.format(name) for name in drawn.CLASSES[kind]}
    assert all(p.std() > 5 for p in pixels)  # a drawing, not a blank page


def test_every_glyph_font_draws_every_character():
    """font_files() leaves out fonts without digits or letters (matplotlib's DejaVu "Display" fonts draw
    nothing)."""
    fonts = [ImageFont.truetype(path, 40) for path in drawn.font_files()] + [ImageFont.load_default(size=40)]
    for font in fonts:
        for char in "".join(drawn.GLYPH_CHARS.values()):
            layer = Image.new("L", (64, 64), 0)
            ImageDraw.Draw(layer).text((4, 4), char, fill=255, font=font)
            assert np.asarray(layer).max() == 255, (font.path if hasattr(font, "path") else font, char)


@pytest.mark.parametrize("kind", ["glyphs", "letters", "shapes", "figures"])
def test_scan_layout_centres_and_sizes_the_drawing(kind, tmp_path):
    """--scan: the drawing is centred to about a pixel (a glyph's ink box; a shape's box is centred on the shape's
    centre, not its ink, for a triangle or a crescent, hence the median) and a glyph fills 55-90% of the frame's
    height, as a scanned form's box holds a character; the free layout puts it anywhere."""
    size = 32

    def ink_boxes(scan: bool, out: Path) -> np.ndarray:
        lines = drawn.write_dataset(kind, out, count=30, size=size, seed=3, clean=True, scan=scan)
        boxes = []
        for line in lines:
            ys, xs = np.nonzero(np.asarray(Image.open(out / line["file_name"])) > 64)
            boxes.append((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
        return np.array(boxes, dtype=np.float64)

    scan = ink_boxes(True, tmp_path / "scan")
    off_centre = np.abs((scan[:, :2] + scan[:, 2:]) / 2 - size / 2).max(axis=1)
    assert np.median(off_centre) <= 1.0, off_centre
    if kind in drawn.GLYPH_CHARS:
        assert off_centre.max() <= 2.5, off_centre
        heights = (scan[:, 3] - scan[:, 1]) / size
        assert heights.min() >= 0.55 and heights.max() <= 0.9, heights
    free = ink_boxes(False, tmp_path / "free")
    assert np.median(np.abs((free[:, :2] + free[:, 2:]) / 2 - size / 2).max(axis=1)) > 3.0


@pytest.mark.parametrize("kind", ["shapes", "figures"])
def test_upright_draws_each_class_in_one_pose(kind, tmp_path):
    """--upright: the same pictures but never turned, so the pictures of a class are far more alike (mean
    pairwise correlation of their ink) than the turned ones; the files and captions are the same."""

    def class_alikeness(upright: bool, out: Path) -> tuple[float, list[dict]]:
        lines = drawn.write_dataset(
            kind, out, count=80, size=32, seed=2, clean=True, scan=True, upright=upright
        )
        alike = []
        for label in {"shapes": (2, 9), "figures": (5, 8)}[kind]:  # triangle, crescent; arrow, corner
            ink = np.stack(
                [
                    np.asarray(Image.open(out / m["file_name"]), dtype=np.float64).ravel()
                    for m in lines
                    if m["label"] == label
                ]
            )
            corr = np.corrcoef(ink)
            alike.append(corr[np.triu_indices(len(ink), 1)].mean())
        return float(np.mean(alike)), lines

    upright, lines = class_alikeness(True, tmp_path / "upright")
    turned, turned_lines = class_alikeness(False, tmp_path / "turned")
    assert lines == turned_lines  # same classes, captions and files
    assert upright > turned + 0.15, (upright, turned)
