"""The built-in residual-VQ tokenizer fitted on your own image files: round trip quality on held-out images,
determinism, files on disk, the `fit-tokenizer` CLI and the tokenizer record a dataset keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pixel_helpers import write_pictures

from lumina.cli.data import main as cli_main
from lumina.ingest.fit_tokenizer import fit_on_files, heldout_indices, read_images
from lumina.tokenizers.pixels import Preparation
from lumina.tokenizers.registry import load_visual_tokenizer
from lumina.tokenizers.rvq_quantizer import RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer, psnr
from lumina.tokenizers.visual import (
    VisualTokenizerRecord,
    check_fits_model,
    check_unchanged,
    directory_fingerprint,
)

SETTINGS = RVQSettings(patch_size=4, codebook_size=32, num_codebooks=4, kmeans_iters=10, seed=3)
PSNR_FLOOR_DB = 20.0  # held-out pictures (boxes at unseen places on plain backgrounds, noise sd 2): 22.1 dB measured


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """40 pictures of 24 x 30 px (read at 16 px: long side 30 -> 16, so 13 x 16, centre-cropped to 12 x 16)."""
    return write_pictures(tmp_path_factory.mktemp("pictures"), 40, 24, 30, seed=1)


@pytest.fixture(scope="module")
def fitted(pictures):
    return fit_on_files([p for p, _, _ in pictures], SETTINGS, image_size=16, heldout_fraction=0.2)


def test_pixels_codes_pixels_beats_the_floor_on_held_out_images(pictures, fitted):
    tokenizer, report = fitted
    files = [p for p, _, _ in pictures]
    held = heldout_indices(len(files), 0.2, SETTINGS.seed)
    assert report["heldout_images"] == len(held) == 8 and report["train_images"] == 32
    assert report["heldout_files"] == [str(files[i]) for i in held]
    heldout = torch.stack(read_images([files[i] for i in held], Preparation(16, 4)))
    codes, grid = tokenizer.encode(heldout)
    assert grid == (3, 4) and codes.shape == (8, 12, 4) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < 32
    decoded = tokenizer.decode(codes, grid)
    assert decoded.shape == (8, 3, 12, 16)
    assert psnr(decoded, heldout) == pytest.approx(report["heldout_psnr_db"])
    assert report["heldout_psnr_db"] > PSNR_FLOOR_DB
    # far better than each held-out image's own mean colour (what a 1-code tokenizer could do at best)
    means = heldout.mean(dim=(2, 3), keepdim=True).expand_as(heldout)
    assert report["heldout_psnr_db"] > psnr(means, heldout) + 6  # 15.3 dB measured for the means


def test_fit_is_deterministic_and_seeded(pictures, fitted):
    files = [p for p, _, _ in pictures]
    again, report = fit_on_files(files, SETTINGS, image_size=16, heldout_fraction=0.2)
    assert torch.equal(again.rvq.codebooks, fitted[0].rvq.codebooks) and report == fitted[1]
    other, _ = fit_on_files(files, RVQSettings(**{**vars(SETTINGS), "seed": 4}), 16, 0.2)
    assert not torch.equal(other.rvq.codebooks, fitted[0].rvq.codebooks)


def test_saved_tokenizer_reloads_identically(tmp_path, fitted):
    tokenizer, report = fitted
    directory = tokenizer.save(tmp_path / "tok")
    assert sorted(p.name for p in directory.iterdir()) == ["rvq.safetensors", "visual_tokenizer.json"]
    doc = json.loads((directory / "visual_tokenizer.json").read_text())
    assert (doc["name"], doc["num_codebooks"], doc["codebook_size"], doc["patch_size"], doc["image_size"]) == \
        ("rvq", 4, 32, 4, 16)
    assert doc["report"]["heldout_psnr_db"] == report["heldout_psnr_db"]
    loaded = load_visual_tokenizer(directory)
    assert isinstance(loaded, RVQVisualTokenizer) and torch.equal(loaded.rvq.codebooks, tokenizer.rvq.codebooks)
    # a second save writes the same bytes (deterministic files), hence the same fingerprint
    again = tokenizer.save(tmp_path / "tok2")
    for name in ("rvq.safetensors", "visual_tokenizer.json"):
        assert (again / name).read_bytes() == (directory / name).read_bytes()
    assert directory_fingerprint(again) == directory_fingerprint(directory)
    loaded.report = {}
    assert directory_fingerprint(loaded.save(tmp_path / "tok3")) != directory_fingerprint(directory)


def test_cli_fit_tokenizer_reports_held_out_psnr(tmp_path, pictures, fitted, capsys):
    folder = pictures[0][0].parent
    code = cli_main(["fit-tokenizer", str(folder), "--out", str(tmp_path / "tok"), "--codebooks", "4",
                     "--codebook-size", "32", "--patch", "4", "--image-size", "16", "--heldout", "0.2", "--seed", "3",
                     "--kmeans-iters", "10"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"held-out 8 images {fitted[1]['heldout_psnr_db']:.2f} dB" in out
    assert torch.equal(load_visual_tokenizer(tmp_path / "tok").rvq.codebooks, fitted[0].rvq.codebooks)
    code = cli_main(["fit-tokenizer", str(folder), "--out", str(tmp_path / "bad"), "--image-size", "18"])
    assert code == 2
    assert "image_size=18: must be a multiple of patch_size=4" in capsys.readouterr().err


def test_record_names_and_guards_the_tokenizer(tmp_path, fitted):
    tokenizer = fitted[0]
    directory = tokenizer.save(tmp_path / "tok")
    record = VisualTokenizerRecord.of(tokenizer, directory)
    assert (record.name, record.version, record.num_codebooks, record.codebook_size, record.patch_size,
            record.image_size) == ("rvq", 1, 4, 32, 4, 16)
    assert torch.equal(load_visual_tokenizer(record.path).rvq.codebooks, tokenizer.rvq.codebooks)
    check_fits_model(record, 4, 32, "here")
    with pytest.raises(ValueError, match=r"here: the visual tokenizer rvq has num_codebooks=4, codebook_size=32; "
                                         r"the model has num_codebooks=8, codebook_size=4096"):
        check_fits_model(record, 8, 4096, "here")
    # refitted files under the recorded path: the record no longer matches them
    refit = RVQVisualTokenizer(tokenizer.rvq.__class__(tokenizer.rvq.codebooks + 0.01, tokenizer.rvq.settings), 16)
    refit.save(directory)
    with pytest.raises(ValueError, match=rf"visual tokenizer at .* changed since the data was built: recorded "
                                         rf"fingerprint {record.fingerprint}, the files there have [0-9a-f]{{16}}"):
        check_unchanged(record)


def test_builtin_is_the_world_tokenizer():
    from lumina.world.dataset import cached_world_image_tokenizer

    builtin = load_visual_tokenizer("builtin")
    assert builtin.image_size == 32 and torch.equal(builtin.rvq.codebooks, cached_world_image_tokenizer().codebooks)
    with pytest.raises(FileNotFoundError, match="no visual_tokenizer.json there"):
        load_visual_tokenizer("/nonexistent/tok")


def test_tokenizer_modules_import_neither_each_other_nor_the_world():
    """No import circle, deferred imports included: visual.py (the base) imports no implementation, and no
    tokenizer module imports the world (the registry, lumina.tokenizers.registry, resolves 'builtin')."""
    import ast

    from lumina import tokenizers

    def imported(path) -> set[str]:
        tree = ast.parse(path.read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | \
            {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}

    folder = Path(tokenizers.__file__).parent
    for path in folder.glob("*.py"):
        assert not {m for m in imported(path) if m.startswith("lumina.world")}, path.name
    assert not imported(folder / "visual.py") & {"lumina.tokenizers.rvq_tokenizer", "lumina.tokenizers.atoken"}
