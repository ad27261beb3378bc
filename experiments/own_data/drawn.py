"""Drawn datasets for the own-data recipe: small greyscale pictures as a Hugging Face imagefolder.

Four kinds, ten classes each, whose captions share one template and differ only in the class word:
    glyphs  a digit (0-9) in one of the DejaVu fonts matplotlib bundles or PIL's default font, at a random
            size, position and tilt                                     "the digit seven"
    letters ten capital letters, drawn as the digits are              "the letter K"
    shapes  a geometric shape (circle, square, ...), filled or outlined, at a random size, position, stroke
            and rotation                                                "a drawing of a star"
    figures ten other outlines (pentagon, octagon, ellipse, heart, arrow, ...), drawn as the shapes are
                                                                        "a picture of a heart"
Every picture gets a random background and ink grey level, a few distractor specks and Gaussian pixel noise,
so no two pictures of a class are alike and the class is only readable from the drawing. Generation is
seeded: the same (kind, count, size, seed) writes the same files.

    python experiments/own_data/drawn.py glyphs pics/glyphs --count 900 --size 32 --seed 0
writes pics/glyphs/<class>/<i>.png and pics/glyphs/metadata.jsonl ({"file_name", "text", "label"}).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SHAPES = ("circle", "square", "triangle", "diamond", "plus", "ring", "star", "hexagon", "bar", "crescent")
FIGURES = (
    "pentagon",
    "octagon",
    "ellipse",
    "semicircle",
    "heart",
    "arrow",
    "trapezoid",
    "frame",
    "corner",
    "fan",
)
LETTERS = ("A", "C", "E", "H", "K", "M", "P", "R", "W", "Y")
CLASSES = {"glyphs": DIGITS, "shapes": SHAPES, "figures": FIGURES, "letters": LETTERS}
TEMPLATES = {
    "glyphs": "the digit {}",
    "shapes": "a drawing of a {}",
    "figures": "a picture of a {}",
    "letters": "the letter {}",
}
STREAMS = {"figures": 0, "glyphs": 1, "shapes": 2, "letters": 3}  # each kind's random stream, fixed for good
GLYPH_CHARS = {"glyphs": "0123456789", "letters": "".join(LETTERS)}  # the kinds drawn as a font's characters
SUPERSAMPLE = 4  # drawn at 4x, then reduced with LANCZOS (anti-aliased edges, as a scan has)


def font_files() -> list[str]:
    """The DejaVu TrueType fonts matplotlib bundles that hold digits (the "Display" ones do not; empty
    without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return []
    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return sorted(str(p) for p in folder.glob("DejaVu*.ttf") if "Display" not in p.name)


def _font(rng: np.random.Generator, fonts: list[str], size: int) -> ImageFont.FreeTypeFont:
    choice = int(rng.integers(len(fonts) + 1))
    return (
        ImageFont.load_default(size=size) if choice == len(fonts) else ImageFont.truetype(fonts[choice], size)
    )


def draw_glyph(
    char: str, size: int, rng: np.random.Generator, fonts: list[str], scan: bool = False
) -> Image.Image:
    """A white character (a digit or a letter) on black at SUPERSAMPLE x `size` px (mode "L"): anywhere,
    45-85% of the frame, tilt +-15 deg; or (scan) as a digitised form's box holds it: the glyph's ink scaled to 65-85% of the frame's height,
    centred to +-1 px, tilt +-6 deg."""
    big = size * SUPERSAMPLE
    font = _font(rng, fonts, int(big * (0.8 if scan else rng.uniform(0.45, 0.85))))
    layer = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(layer)
    left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
    if scan:
        glyph = Image.new("L", (right - left, bottom - top), 0)
        ImageDraw.Draw(glyph).text((-left, -top), char, fill=255, font=font)
        glyph = glyph.crop(glyph.getbbox())
        scale = min(big * rng.uniform(0.65, 0.85) / glyph.height, big * 0.85 / glyph.width)
        glyph = glyph.resize(
            (max(1, round(glyph.width * scale)), max(1, round(glyph.height * scale))), Image.LANCZOS
        )
        jitter = rng.uniform(-SUPERSAMPLE, SUPERSAMPLE, 2)
        layer.paste(
            glyph, (round((big - glyph.width) / 2 + jitter[0]), round((big - glyph.height) / 2 + jitter[1]))
        )
        return layer.rotate(float(rng.uniform(-6, 6)), resample=Image.BICUBIC)
    x = rng.uniform(0, max(big - (right - left), 1)) - left
    y = rng.uniform(0, max(big - (bottom - top), 1)) - top
    draw.text((x, y), char, fill=255, font=font)
    return layer.rotate(float(rng.uniform(-15, 15)), resample=Image.BICUBIC)


def _polygon(cx: float, cy: float, r: float, n: int, turn: float, inner: float | None = None) -> list[tuple]:
    points = []
    for k in range(n * (2 if inner else 1)):
        radius = r if inner is None or k % 2 == 0 else r * inner
        angle = turn + 2 * math.pi * k / (n * (2 if inner else 1))
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _placed(unit: list[tuple[float, float]], cx: float, cy: float, r: float, turn: float) -> list[tuple]:
    """Points given in units of the radius, turned by `turn` and placed at (cx, cy)."""
    c, s = math.cos(turn), math.sin(turn)
    return [(cx + r * (c * x - s * y), cy + r * (s * x + c * y)) for x, y in unit]


def _arc(
    start: float, stop: float, n: int = 24, sx: float = 1.0, sy: float = 1.0
) -> list[tuple[float, float]]:
    return [(sx * math.cos(a), sy * math.sin(a)) for a in np.linspace(start, stop, n)]


def _heart() -> list[tuple[float, float]]:
    t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t)) - 2.5
    return [(float(a) / 16, float(b) / 16) for a, b in zip(x, y, strict=True)]


# the figures' outlines in units of the radius, centred on the origin before they are turned
FIGURE_OUTLINES = {
    "pentagon": _polygon(0, 0, 1, 5, 0),
    "octagon": _polygon(0, 0, 1, 8, 0),
    "ellipse": _arc(0, 2 * math.pi, 48, 1.0, 0.55),
    "semicircle": [(x, y - 0.42) for x, y in _arc(0, math.pi, 24)],
    "heart": _heart(),
    "arrow": [(-1, -0.2), (0.15, -0.2), (0.15, -0.6), (1, 0), (0.15, 0.6), (0.15, 0.2), (-1, 0.2)],
    "trapezoid": [(-1, 0.6), (1, 0.6), (0.4, -0.6), (-0.4, -0.6)],
    "corner": [(-0.8, -0.8), (-0.3, -0.8), (-0.3, 0.3), (0.8, 0.3), (0.8, 0.8), (-0.8, 0.8)],
    "fan": [(-0.6, -0.6)] + [(x * 1.6 - 0.6, y * 1.6 - 0.6) for x, y in _arc(0, math.pi / 2, 16)],
}


def draw_shape(
    name: str, size: int, rng: np.random.Generator, scan: bool = False, upright: bool = False
) -> Image.Image:
    """A white shape or figure (`name` from SHAPES or FIGURES) on black at SUPERSAMPLE x `size` px (mode "L"):
    radius 20-40% of the frame, anywhere; or (scan) radius 30-42%, centred to +-1 px. Turned at random, or
    (upright) never: every drawing of a class in one pose (the same random draws otherwise)."""
    big = size * SUPERSAMPLE
    layer = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(layer)
    if scan:
        r = big * rng.uniform(0.3, 0.42)
        cx, cy = big / 2 + rng.uniform(-SUPERSAMPLE, SUPERSAMPLE, 2)
    else:
        r = big * rng.uniform(0.2, 0.4)
        cx, cy = (rng.uniform(r, big - r) for _ in range(2))
    turn = float(rng.uniform(0, 2 * math.pi))  # drawn either way, so upright keeps every other draw
    if upright:
        turn = 0.0
    width = int(big * rng.uniform(0.04, 0.1))
    filled = bool(rng.random() < 0.5)
    fill, outline = (255, None) if filled else (None, 255)
    if name == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=width)
    elif name == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=255, width=max(width * 2, int(r * 0.35)))
    elif name == "frame":  # a square ring
        square = _placed([(-0.8, -0.8), (0.8, -0.8), (0.8, 0.8), (-0.8, 0.8)], cx, cy, r, turn)
        draw.polygon(square, outline=255, width=max(width * 2, int(r * 0.3)))
    elif name in FIGURE_OUTLINES:
        draw.polygon(_placed(FIGURE_OUTLINES[name], cx, cy, r, turn), fill=fill, outline=outline, width=width)
    elif name in ("square", "triangle", "diamond", "hexagon"):
        n, turn = {
            "square": (4, turn),
            "triangle": (3, turn),
            "diamond": (4, math.pi / 2),
            "hexagon": (6, turn),
        }[name]
        r = r * (0.8 if name == "diamond" else 1.0)
        points = _polygon(cx, cy, r, n, turn)
        if name == "diamond":  # a rhombus: squashed across its vertical axis
            points = [(cx + (px - cx) * 0.6, py) for px, py in points]
        draw.polygon(points, fill=fill, outline=outline, width=width)
    elif name == "star":
        draw.polygon(_polygon(cx, cy, r, 5, turn, inner=0.4), fill=fill, outline=outline, width=width)
    elif name == "plus":
        arm = max(width * 2, int(r * 0.35))
        draw.line(_polygon(cx, cy, r, 2, turn), fill=255, width=arm)
        draw.line(_polygon(cx, cy, r, 2, turn + math.pi / 2), fill=255, width=arm)
    elif name == "bar":
        draw.line(_polygon(cx, cy, r, 2, turn), fill=255, width=max(width * 2, int(r * 0.3)))
    elif name == "crescent":  # a disc with an offset disc cut out
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
        dx, dy = 0.5 * r * math.cos(turn), 0.5 * r * math.sin(turn)
        draw.ellipse((cx + dx - r, cy + dy - r, cx + dx + r, cy + dy + r), fill=0)
    else:
        raise ValueError(f"name={name!r}: not one of SHAPES or FIGURES")
    return layer


def finish(layer: Image.Image, size: int, rng: np.random.Generator, clean: bool = False) -> Image.Image:
    """Ink mask -> a noisy greyscale picture: random background / ink levels, specks, Gaussian noise
    (clean: white ink on black, nothing else; an easier variant for the A/Bs)."""
    mask = np.asarray(layer.resize((size, size), Image.LANCZOS), dtype=np.float32) / 255.0
    if clean:
        return Image.fromarray((mask * 255).round().astype(np.uint8), mode="L")
    background, ink = rng.uniform(0, 90), rng.uniform(160, 255)
    if rng.random() < 0.5:  # dark ink on a light page as often as light on dark
        background, ink = 255 - background, 255 - ink
    picture = background + (ink - background) * mask
    for _ in range(int(rng.integers(0, 4))):  # distractor specks
        y, x = rng.integers(0, size, 2)
        picture[y, x] = rng.uniform(0, 255)
    picture += rng.normal(0, rng.uniform(4, 20), picture.shape)
    return Image.fromarray(np.clip(picture, 0, 255).round().astype(np.uint8), mode="L")


def write_dataset(
    kind: str,
    out: str | Path,
    count: int,
    size: int = 32,
    seed: int = 0,
    clean: bool = False,
    scan: bool = False,
    upright: bool = False,
) -> list[dict]:
    """Write `count` pictures of `kind` (balanced over its ten classes) as an imagefolder under `out`."""
    if kind not in CLASSES:
        raise ValueError(f"kind={kind!r}: expected one of {sorted(CLASSES)}")
    if count <= 0 or size < 8:
        raise ValueError(f"count={count}, size={size}: need count > 0 and size >= 8")
    out, fonts = Path(out), font_files()
    rng = np.random.default_rng([seed, STREAMS[kind]])
    lines = []
    for i in range(count):
        label = i % len(CLASSES[kind])
        layer = (
            draw_glyph(GLYPH_CHARS[kind][label], size, rng, fonts, scan)
            if kind in GLYPH_CHARS
            else draw_shape(CLASSES[kind][label], size, rng, scan, upright)
        )
        name = CLASSES[kind][label]
        file_name = f"{name}/{i:05d}.png"
        (out / name).mkdir(parents=True, exist_ok=True)
        finish(layer, size, rng, clean).save(out / file_name)
        lines.append({"file_name": file_name, "text": TEMPLATES[kind].format(name), "label": label})
    (out / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=sorted(CLASSES))
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=900)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clean", action="store_true", help="white ink on black, no noise (an easier variant)"
    )
    parser.add_argument(
        "--scan", action="store_true", help="centred and size-normalised, as scanned forms are"
    )
    parser.add_argument(
        "--upright", action="store_true", help="shapes and figures never turned (one pose per class)"
    )
    args = parser.parse_args(argv)
    lines = write_dataset(
        args.kind, args.out, args.count, args.size, args.seed, args.clean, args.scan, args.upright
    )
    print(f"{len(lines)} pictures of {args.kind} in {args.out}")


if __name__ == "__main__":
    main()
