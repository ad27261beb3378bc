"""`lumina-data build` with image / video file parts: the same shards as the same manifest with those codes
inline, independent of batch size and workers; the tokenizer recorded in the shards; every bad file named by
its manifest line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from pixel_helpers import picture, write_truncated_png
from sample_helpers import NEWLINE

from lumina.cli.data import main as cli_main
from lumina.data.dataset_assets import save_assets
from lumina.data.storage import ParquetSampleDataset
from lumina.ingest.build_shards import BuildError, build_shards
from lumina.ingest.encode import PixelEncoder
from lumina.tokenizers.pixels import to_signed
from lumina.tokenizers.registry import load_visual_tokenizer
from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer, RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.visual import check_unchanged, directory_fingerprint

SIZE = 16


@pytest.fixture(scope="module")
def tokenizer() -> RVQVisualTokenizer:
    """A tokenizer fitted on pictures other than the ones built below (C = 3, K = 16, 16 px, patch 4)."""
    rng = np.random.default_rng(7)
    images = to_signed(np.stack([picture(rng, SIZE, SIZE) for _ in range(12)]))
    return RVQVisualTokenizer(RVQImageTokenizer.fit(images, RVQSettings(4, 16, 3, 8, 0)), SIZE)


@pytest.fixture
def tokens():
    from lumina.contract.special_tokens import SpecialTokens

    return SpecialTokens.official(newline=NEWLINE).replace(codebook_size=16, num_codebooks=3)


def write_frames(directory: Path, count: int, seed: int) -> list[np.ndarray]:
    """`count` PNGs f<seed>_<i>.png at exactly the tokenizer's size (read back unchanged)."""
    rng = np.random.default_rng(seed)
    frames = [picture(rng, SIZE, SIZE) for _ in range(count)]
    for i, f in enumerate(frames):
        Image.fromarray(f).save(directory / f"f{seed}_{i}.png")
    return frames


def t2i(sid: str, image: dict) -> dict:
    return {"id": sid, "turns": [{"role": "user", "parts": [{"kind": "text", "ids": [1, 2]}]},
                                 {"role": "assistant", "parts": [image]}]}


def understand(sid: str, media: list[dict]) -> dict:
    return {"id": sid, "turns": [{"role": "user", "parts": [*media, {"kind": "text", "ids": [3]}]},
                                 {"role": "assistant", "parts": [{"kind": "text", "ids": [4, 5]}]}]}


def write_manifest(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def manifests(tmp_path, tokenizer):
    """The same rows twice: with file parts (files.jsonl) and with the codes inline (inline.jsonl), the inline
    codes computed by encoding the known pixels directly."""
    frames = {seed: write_frames(tmp_path, n, seed) for seed, n in ((0, 5), (1, 3), (2, 1))}

    def codes(pixels: list[np.ndarray]) -> list:
        return tokenizer.encode(to_signed(np.stack(pixels)))[0].tolist()

    file_rows, inline_rows = [], []
    for i in range(5):
        file_rows.append(t2i(f"img-{i}", {"kind": "image", "file": f"f0_{i}.png"}))
        inline_rows.append(t2i(f"img-{i}", {"kind": "image", "codes": codes([frames[0][i]])[0], "grid": [4, 4]}))
    video_codes = [c for frame in codes(frames[1]) for c in frame]  # (t, y, x) order
    file_rows.append(understand("vid", [{"kind": "video", "files": [f"f1_{i}.png" for i in range(3)]},
                                        {"kind": "image", "file": "f2_0.png"}]))
    inline_rows.append(understand("vid", [{"kind": "video", "codes": video_codes, "grid": [3, 4, 4]},
                                          {"kind": "image", "codes": codes(frames[2])[0], "grid": [4, 4]}]))
    file_rows.insert(2, understand("text-only", []))
    inline_rows.insert(2, understand("text-only", []))
    return write_manifest(tmp_path / "files.jsonl", file_rows), write_manifest(tmp_path / "inline.jsonl", inline_rows)


def build(manifest: Path, out: Path, tokens, tokenizer, batch_size: int = 64, workers: int = 0, **kw):
    assets = save_assets(out, None, tokenizer)
    return build_shards([manifest], out, tokens, pixels=PixelEncoder(tokenizer, batch_size, workers),
                        assets=assets, rows_per_shard=4, **kw)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.parquet"))}


def test_file_parts_build_the_same_shards_as_inline_codes(tmp_path, manifests, tokens, tokenizer):
    files, inline = manifests
    report = build(files, tmp_path / "from_files", tokens, tokenizer)
    assert (report.rows_written, report.rows_skipped, len(report.shards)) == (7, 0, 2)
    build(inline, tmp_path / "from_codes", tokens, tokenizer)
    for name in ("shard-00000.parquet", "shard-00001.parquet"):
        a, b = (pq.read_table(tmp_path / d / name) for d in ("from_files", "from_codes"))
        assert a.equals(b) and a.schema.metadata == b.schema.metadata
    assert shard_bytes(tmp_path / "from_files") == shard_bytes(tmp_path / "from_codes")
    ds = ParquetSampleDataset(tmp_path / "from_files")
    video = ds[6].turns[0].parts[0]
    assert video.kind == "video" and video.grid == (3, 4, 4) and video.codes.shape == (48, 3)


def test_build_is_deterministic_in_batch_size_and_workers(tmp_path, manifests, tokens, tokenizer):
    files, _ = manifests
    build(files, tmp_path / "a", tokens, tokenizer, batch_size=64, workers=0)
    build(files, tmp_path / "b", tokens, tokenizer, batch_size=2, workers=2)
    build(files, tmp_path / "c", tokens, tokenizer, batch_size=3, workers=0)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b") == shard_bytes(tmp_path / "c")
    assert len(shard_bytes(tmp_path / "a")) == 2


def test_shards_record_the_tokenizer_that_made_them(tmp_path, manifests, tokens, tokenizer):
    files, _ = manifests
    build(files, tmp_path / "out", tokens, tokenizer)
    moved = tmp_path / "elsewhere"
    (tmp_path / "out").rename(moved)  # paths are stored relative to the shards: the dataset moves as a whole
    ds = ParquetSampleDataset(moved)
    record = ds.assets.visual_tokenizer
    assert (record.name, record.num_codebooks, record.codebook_size, record.patch_size, record.image_size) == \
        ("rvq", 3, 16, 4, SIZE)
    assert record.path == str(moved / "visual_tokenizer") and ds.assets.text_tokenizer is None
    check_unchanged(record)  # the moved files are the recorded ones
    assert torch.equal(load_visual_tokenizer(record.path).rvq.codebooks, tokenizer.rvq.codebooks)


BAD = {  # file part -> what the error says (after 'files.jsonl:<line>: turns[1].parts[0]')
    "missing": ({"kind": "image", "file": "gone.png"}, r"\.file: image file .*gone.png does not exist"),
    "truncated": ({"kind": "image", "file": "cut.png"}, r": image file .*cut.png is truncated or corrupt"),
    "unreadable": ({"kind": "image", "file": "text.png"}, r": image file .*text.png is not a readable image"),
    "too small": ({"kind": "image", "file": "small.png"},
                  r": image file .*small.png is 2x40 px, 1x16 after resizing \(max_edge=16\): a side is under one 4 px"),
    "gif": ({"kind": "image", "file": "anim.gif"}, r": image file .*anim.gif is GIF; expected one of PNG"),
    "missing frame": ({"kind": "video", "files": ["f0_0.png", "gone.png"]},
                      r"\.files\[1\]: image file .*gone.png does not exist"),
    "bad frame": ({"kind": "video", "files": ["f0_0.png", "cut.png"]}, r": image file .*cut.png is truncated"),
    "grid given": ({"kind": "image", "file": "f0_0.png", "grid": [4, 4]}, r"\.grid: the grid of image files is the"),
    "two sources": ({"kind": "image", "file": "f0_0.png", "codes": [[0, 0, 0]]},
                    r": a image part needs exactly one of 'path', 'codes' or 'file', got \['codes', 'file'\]"),
    "video file": ({"kind": "video", "file": "f0_0.png"}, r": a video part takes its image files as 'files'"),
    "mesh file": ({"kind": "mesh3d", "file": "f0_0.png"}, r": a mesh3d part takes no image files"),
}


@pytest.fixture
def bad_files(tmp_path):
    write_frames(tmp_path, 1, 0)
    write_truncated_png(tmp_path / "cut.png")
    (tmp_path / "text.png").write_text("hello")
    Image.fromarray(np.zeros((40, 2, 3), np.uint8)).save(tmp_path / "small.png")
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "anim.gif")
    return tmp_path


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_file_names_the_manifest_line_and_the_file(bad_files, tokens, tokenizer, case):
    part, pattern = BAD[case]
    manifest = write_manifest(bad_files / "files.jsonl", [t2i("good", {"kind": "image", "file": "f0_0.png"}),
                                                          t2i("bad", part)])
    with pytest.raises(BuildError, match=r"files.jsonl:2: turns\[1\]\.parts\[0\]" + pattern):
        build(manifest, bad_files / "out", tokens, tokenizer)


def test_skip_counts_and_lists_every_bad_file(bad_files, tokens, tokenizer):
    rows = [t2i(f"bad-{case}", BAD[case][0]) for case in sorted(BAD)]
    rows.insert(3, t2i("good-0", {"kind": "image", "file": "f0_0.png"}))
    rows.append(t2i("good-1", {"kind": "image", "file": "f0_0.png"}))
    manifest = write_manifest(bad_files / "files.jsonl", rows)
    report = build(manifest, bad_files / "out", tokens, tokenizer, batch_size=2, workers=2, on_error="skip")
    assert report.rows_written == 2 and report.rows_skipped == len(BAD)
    bad_lines = [1, 2, 3] + list(range(5, len(BAD) + 2))
    assert [s.line for s in report.skipped] == bad_lines
    assert ParquetSampleDataset(bad_files / "out").sample_ids() == ["good-0", "good-1"]
    listed = json.loads((bad_files / "out" / "build_report.json").read_text())
    assert listed["rows_skipped"] == len(BAD) and [s["line"] for s in listed["skipped"]] == bad_lines


def test_image_files_need_a_visual_tokenizer(tmp_path, tokens):
    write_frames(tmp_path, 1, 0)
    manifest = write_manifest(tmp_path / "m.jsonl", [t2i("a", {"kind": "image", "file": "f0_0.png"})])
    with pytest.raises(BuildError, match=r"m.jsonl:1: turns\[1\]\.parts\[0\]\.file: image files need a visual "
                                         r"tokenizer \(pass --image-tokenizer builtin\|atoken\|DIR\)"):
        build_shards([manifest], tmp_path / "out", tokens)


def test_cli_build_with_image_tokenizer(tmp_path, manifests, tokenizer, capsys):
    files, _ = manifests
    tokenizer.save(tmp_path / "tok")
    code = cli_main(["build", str(files), "--out", str(tmp_path / "out"), "--image-tokenizer", str(tmp_path / "tok"),
                     "--workers", "2", "--batch-size", "4", "--no-progress", "--newline-id", str(NEWLINE)])
    assert code == 0 and "wrote 7 rows to 1 shards" in capsys.readouterr().out
    ds = ParquetSampleDataset(tmp_path / "out")
    assert (ds.tokens.codebook_size, ds.tokens.num_codebooks) == (16, 3)  # the tokenizer's, not 4096 x 8
    assert ds.assets.visual_tokenizer.fingerprint == directory_fingerprint(tmp_path / "tok")  # the same files
    code = cli_main(["build", str(files), "--out", str(tmp_path / "out2"), "--image-tokenizer", str(tmp_path / "tok"),
                     "--num-codebooks", "8"])
    assert code == 2
    assert "--num-codebooks=8 disagrees with the visual tokenizer" in capsys.readouterr().err
