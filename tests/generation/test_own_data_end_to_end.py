"""End to end on your own data: 64 generated PNGs with captions -> an imagefolder -> `lumina-data fit-tokenizer`
and `build` -> `lumina-train data=parquet` (tiny model, 20 steps) -> `lumina-generate` writes PNGs of the
dataset's size through the tokenizer the data recorded, and reads image files for task=understand."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from lumina.cli.data import main as data_main

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from pixel_helpers import write_imagefolder  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
SIZE = 16  # the tokenizer's image size: pictures are 20 x 24 px, read at 16 x 16


def _run(code: str, *args: str, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    write_imagefolder(root / "pics", 64, 20, 24, seed=3)
    assert data_main(["fit-tokenizer", str(root / "pics"), "--out", str(root / "tok"), "--image-size", str(SIZE),
                      "--codebooks", "4", "--codebook-size", "64", "--kmeans-iters", "8"]) == 0
    assert data_main(["build", "--imagefolder", str(root / "pics"), "--image-tokenizer", str(root / "tok"),
                      "--out", str(root / "data"), "--tasks", "t2i,caption", "--no-progress"]) == 0
    done = _run("from lumina.cli.train import main; main()", "experiment=debug", "data=parquet",
                f"data.sources.0.path={root}/data/train", f"data.sources.0.options.val_path={root}/data/val",
                "trainer.max_steps=20", "logger=none", "callbacks.progress_bar=null", "callbacks.expert_usage=null",
                "trainer.enable_model_summary=false", f"hydra.run.dir={root}/run", cwd=root)
    return root, done.stdout


def test_training_learns_and_exports_the_datasets_tokenizers(trained):
    root, stdout = trained
    first, last = map(float, re.search(r"train loss\s+([\d.]+) \(first step\) -> ([\d.]+)", stdout).groups())
    assert last < first
    hf = root / "run" / "hf"
    assert (hf / "tokenizer.json").read_bytes() == (root / "data" / "tokenizer.json").read_bytes()
    for name in ("visual_tokenizer.json", "rvq.safetensors"):
        assert (hf / "visual_tokenizer" / name).read_bytes() == (root / "tok" / name).read_bytes()


def _generate(root: Path, name: str, overrides: list[str]) -> Path:
    """`lumina-generate` in this process: the CLI's config composed with `overrides`, then `run(cfg)`."""
    from hydra import compose, initialize_config_dir

    from lumina.cli.train import CONF_DIR
    from lumina.generation.run import run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("generate", overrides=[f"checkpoint={root}/run/hf", *overrides])
    cfg.output_dir = str(root / name)
    return run(cfg)


def test_generate_t2i_writes_pngs_of_the_datasets_size(trained):
    root, _ = trained
    out = _generate(root, "t2i", ["task=t2i", 'prompts=["a red box","a blue box"]', "image.steps=3"])
    lines = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [(line["file"], line["grid"]) for line in lines] == [("image_0.png", [4, 4]), ("image_1.png", [4, 4])]
    for name in ("image_0.png", "image_1.png"):
        assert Image.open(out / name).size == (SIZE, SIZE)
    assert Image.open(out / "images.png").size == (2 * (SIZE + 2), SIZE)


def test_generate_understand_reads_an_image_file(trained):
    root, _ = trained
    picture = root / "pics" / "000.png"
    out = _generate(root, "understand", ["task=understand", 'prompts=["describe the image ."]',
                                         f"images=[{picture}]", "text.gen_length=4", "text.block_length=4",
                                         "text.steps=2"])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["image"] == str(picture) and len(line["ids"]) <= 4
    vocabulary = set(json.loads((root / "data" / "tokenizer.json").read_text())["model"]["vocab"])
    assert set(line["answer"].split()) <= vocabulary
