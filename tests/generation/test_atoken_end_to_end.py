"""The official-tokenizer path end to end, with the stand-in `atoken_inference` package (tests/atoken_standin):
`lumina-data tokenize-images` writes official token files, `build --imagefolder --image-tokenizer atoken`
makes C x K = 8 x 4096 shards (non-square 48 x 80 px pictures at --max-edge 64: 32 x 64 px, grids 2 x 4), a
tiny model with 8 codebooks of 4096 trains on them, and `lumina-generate` writes a t2i PNG of the asked size
and understands an image file, through the AToken record the checkpoint carries; never off CUDA silently."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from lumina.cli.data import main as data_main
from lumina.tokenizers.token_files import read_token_file

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from gen_helpers import generate  # noqa: E402
from pixel_helpers import write_imagefolder  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}


def atoken_flags(files: dict[str, str]) -> list[str]:
    return ["--image-tokenizer", "atoken", "--atoken-config", files["config"], "--atoken-model", files["checkpoint"],
            "--atoken-package", files["package"], "--device", "cpu", "--max-edge", "64"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, atoken_module_files):
    root = tmp_path_factory.mktemp("atoken-own")
    write_imagefolder(root / "pics", 24, 48, 80, seed=5)  # H 48, W 80
    assert data_main(["build", "--imagefolder", str(root / "pics"), "--out", str(root / "data"), "--no-progress",
                      *atoken_flags(atoken_module_files)]) == 0
    done = subprocess.run(
        [sys.executable, "-c", "from lumina.cli.train import main; main()", "experiment=debug", "data=parquet",
         f"data.sources.0.path={root}/data/train", f"data.sources.0.options.val_path={root}/data/val",
         "model.config.num_codebooks=8", "model.config.codebook_size=4096", "trainer.max_steps=10",
         "logger=none", "callbacks.progress_bar=null", "callbacks.expert_usage=null",
         "trainer.enable_model_summary=false", f"hydra.run.dir={root}/run"],
        cwd=root, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done.stdout


def test_tokenize_images_writes_official_token_files_that_build_reads(tmp_path, atoken_module_files, trained):
    root, _ = trained
    out = tmp_path / "tokens"
    assert data_main(["tokenize-images", str(root / "pics" / "000.png"), str(root / "pics" / "001.png"),
                      "--out", str(out), *atoken_flags(atoken_module_files)]) == 0
    raw = torch.load(out / "000.pkl", weights_only=True)
    assert sorted(raw) == ["coords", "image_height", "image_width", "indices"]  # tools/tokenize_image.py's keys
    assert raw["indices"].dtype == raw["coords"].dtype == torch.int32 and raw["indices"].shape == (8, 8)
    assert (raw["image_height"], raw["image_width"]) == (32, 64)  # 48 x 80 -> 38 x 64 -> crop 32 x 64
    found = read_token_file(out / "000.pkl", "image")
    assert found.grid == (2, 4) and found.image_size == (32, 64)
    # the same codes the imagefolder build put in its t2i sample of that picture
    from lumina.data.storage import ParquetSampleDataset

    samples = {s.id: s for split in ("train", "val") for s in ParquetSampleDataset(root / "data" / split)}
    built = samples["000.png#t2i"].turns[2].parts[0]
    assert built.grid == (2, 4) and torch.equal(built.codes, found.codes)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "turns": [
        {"role": "user", "parts": [{"kind": "image", "path": "tokens/001.pkl"}, {"kind": "text", "ids": [5]}]},
        {"role": "assistant", "parts": [{"kind": "text", "ids": [6]}]}]}) + "\n")
    assert data_main(["build", str(manifest), "--out", str(tmp_path / "shards"), "--newline-id", "201"]) == 0  # 8 x 4096 by default
    assert ParquetSampleDataset(tmp_path / "shards")[0].turns[0].parts[0].grid == (2, 4)


def test_training_on_atoken_shards_learns_and_exports_the_record(trained):
    root, stdout = trained
    first, last = map(float, re.search(r"train loss\s+([\d.]+) \(first step\) -> ([\d.]+)", stdout).groups())
    assert last < first
    record = json.loads((root / "run" / "hf" / "visual_tokenizer" / "visual_tokenizer.json").read_text())
    assert (record["name"], record["num_codebooks"], record["codebook_size"]) == ("atoken", 8, 4096)


def _generate(root: Path, name: str, overrides: list[str]) -> Path:
    return generate(root / "run" / "hf", root / name, overrides)


def test_generate_t2i_png_of_the_asked_size_and_understand_an_image_file(trained):
    root, _ = trained
    out = _generate(root, "t2i", ["task=t2i", 'prompts=["a red box"]', "image.steps=2", "device=cpu",
                                  "height=32", "width=48"])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["grid"] == [2, 3] and Image.open(out / "image_0.png").size == (48, 32)
    picture = root / "pics" / "003.png"
    out = _generate(root, "und", ["task=understand", 'prompts=["describe the image ."]', f"images=[{picture}]",
                                  "input_max_edge=64", "device=cpu", "text.gen_length=4", "text.block_length=4",
                                  "text.steps=2"])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["image"] == str(picture) and len(line["ids"]) <= 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_generate_never_moves_atoken_off_cuda_silently(trained):
    root, _ = trained
    from lumina.tokenizers.atoken import ATokenUnavailable

    with pytest.raises(ATokenUnavailable, match=r"AToken runs on CUDA"):
        _generate(root, "auto", ["task=t2i", 'prompts=["a red box"]', "height=32", "width=48"])
