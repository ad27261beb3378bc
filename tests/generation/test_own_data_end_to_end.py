"""End to end on your own, non-square data: 64 generated PNGs with captions, half 48 x 80 px and half 80 x 48 px
-> an imagefolder -> `lumina-data fit-tokenizer` and `build` (long edge 32: 16 x 32 and 32 x 16 px, grids 4 x 8
and 8 x 4) -> `lumina-train data=parquet` on the built directory as a dataset root (train/ + val/; tiny model,
20 steps) -> `lumina-generate` writes PNGs of the asked
size through the tokenizer the data recorded, and reads image files for task=understand."""

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
from lumina.data.storage import ParquetSampleDataset

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from gen_helpers import generate  # noqa: E402
from pixel_helpers import write_imagefolder  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
SIZE = 32  # the tokenizer's image size (long edge): 48 x 80 px pictures are read at 16 x 32, 80 x 48 at 32 x 16


def _run(code: str, *args: str, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    wide = write_imagefolder(root / "pics", 32, 48, 80, seed=3)
    tall = write_imagefolder(root / "tall", 32, 80, 48, seed=4)
    for line in tall:  # one folder: the tall pictures join the wide ones under new names
        (root / "tall" / line["file_name"]).rename(root / "pics" / f"t{line['file_name']}")
    (root / "pics" / "metadata.jsonl").write_text("".join(
        json.dumps(line) + "\n" for line in wide + [{**t, "file_name": f"t{t['file_name']}"} for t in tall]))
    assert data_main(["fit-tokenizer", str(root / "pics"), "--out", str(root / "tok"), "--image-size", str(SIZE),
                      "--codebooks", "4", "--codebook-size", "64", "--kmeans-iters", "8"]) == 0
    assert data_main(["build", "--imagefolder", str(root / "pics"), "--image-tokenizer", str(root / "tok"),
                      "--out", str(root / "data"), "--tasks", "t2i,caption", "--no-progress"]) == 0
    done = _run("from lumina.cli.train import main; main()", "experiment=debug", "data=parquet",
                f"data.sources.0.path={root}/data", "trainer.max_steps=20", "logger=none", "callbacks.progress_bar=null", "callbacks.expert_usage=null",
                "trainer.enable_model_summary=false", f"hydra.run.dir={root}/run", cwd=root)
    return root, done.stdout + done.stderr


def test_the_built_directory_is_a_dataset_root_read_as_train_and_val(trained):
    root, log = trained
    assert f"{root}/data is a dataset root: training reads {root}/data/train, the held-out split from " \
           f"{root}/data/val" in log
    assert re.search(r"val/loss: [\d.]+", log), log[-2000:]  # the held-out split was evaluated


def test_non_square_pictures_become_grids_of_their_shape(trained):
    root, _ = trained
    grids = {}
    for split in ("train", "val"):
        for sample in ParquetSampleDataset(root / "data" / split):
            media = [p for turn in sample.turns for p in turn.parts if hasattr(p, "grid")]
            grids[sample.id] = media[0].grid
    assert len(grids) == 128  # 64 pictures x (t2i, caption)
    assert {g for sid, g in grids.items() if sid.startswith("t")} == {(8, 4)}
    assert {g for sid, g in grids.items() if not sid.startswith("t")} == {(4, 8)}


def test_training_learns_and_exports_the_datasets_tokenizers(trained):
    root, stdout = trained
    first, last = map(float, re.search(r"train loss\s+([\d.]+) \(first step\) -> ([\d.]+)", stdout).groups())
    assert last < first
    hf = root / "run" / "hf"
    assert (hf / "tokenizer.json").read_bytes() == (root / "data" / "tokenizer.json").read_bytes()
    for name in ("visual_tokenizer.json", "rvq.safetensors"):
        assert (hf / "visual_tokenizer" / name).read_bytes() == (root / "tok" / name).read_bytes()


def _generate(root: Path, name: str, overrides: list[str]) -> Path:
    return generate(root / "run" / "hf", root / name, overrides)


def test_generate_t2i_writes_pngs_of_the_asked_size(trained):
    root, _ = trained
    out = _generate(root, "t2i", ["task=t2i", 'prompts=["a red box","a blue box"]', "image.steps=3", "height=16",
                                  "width=32"])
    lines = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [(line["file"], line["grid"]) for line in lines] == [("image_0.png", [4, 8]), ("image_1.png", [4, 8])]
    for name in ("image_0.png", "image_1.png"):
        assert Image.open(out / name).size == (32, 16)  # PIL: (width, height)
    assert Image.open(out / "images.png").size == (2 * (32 + 2), 16)
    default = _generate(root, "t2i-default", ["task=t2i", 'prompts=["a red box"]', "image.steps=2"])
    assert Image.open(default / "image_0.png").size == (SIZE, SIZE)  # the tokenizer's image size, square
    cells = _generate(root, "t2i-grid", ["task=t2i", 'prompts=["a red box"]', "image.steps=2", "grid=[2,3]"])
    assert Image.open(cells / "image_0.png").size == (12, 8)  # 2 x 3 cells of 4 px
    with pytest.raises(ValueError, match=r"height=18: .*positive multiples of the visual tokenizer's patch \(4 px\)"):
        _generate(root, "t2i-bad", ["task=t2i", 'prompts=["a red box"]', "height=18", "width=32"])


def test_understanding_inputs_are_prepared_as_infer_mmu_sft(trained):
    from lumina.generation.assets import load_assets
    from lumina.generation.run import load_image
    from lumina.model.config import LuminaConfig

    root, _ = trained
    hf = root / "run" / "hf"
    assets = load_assets(hf, "auto", LuminaConfig.from_hf(hf))
    picture = str(root / "pics" / "t000.png")  # 80 x 48 px (H x W), 4 px patches
    assert load_image(picture, assets).grid == (20, 12)  # input_max_edge=0: the native size
    assert load_image(picture, assets, 32).grid == (8, 4)  # long edge 32: 32 x 19 -> 32 x 16
    assert load_image(picture, assets, 160).grid == (40, 24)  # scaled up to long edge 160
    assert load_image(picture, assets, 160, no_upscale=True).grid == (20, 12)  # a ceiling only


def test_generate_understand_reads_an_image_file(trained):
    root, _ = trained
    picture = root / "pics" / "t000.png"  # 80 x 48 px, read at long edge 32 (infer_mmu_sft.py's max_edge)
    out = _generate(root, "understand", ["task=understand", 'prompts=["describe the image ."]',
                                         f"images=[{picture}]", "text.gen_length=4", "text.block_length=4",
                                         "text.steps=2", "input_max_edge=32"])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["image"] == str(picture) and len(line["ids"]) <= 4
    vocabulary = set(json.loads((root / "data" / "tokenizer.json").read_text())["model"]["vocab"])
    assert set(line["answer"].split()) <= vocabulary


def test_eval_on_the_held_out_split_writes_its_scores(trained):
    root, _ = trained
    out = _generate(root, "eval", ["task=eval", f"eval.data={root}/data", "eval.num_items=4", "image.steps=2",
                                   "text.gen_length=8", "text.block_length=8", "text.steps=2"])
    doc = json.loads((out / "eval.json").read_text())
    metrics, answers = doc["metrics"], doc["answers"]
    assert doc["skipped"] == 0 and metrics["understand/items"] == metrics["t2i/items"] == 4.0
    captions = {line["file_name"]: line["text"] for line in map(json.loads, (root / "pics" / "metadata.jsonl")
                                                                .read_text().splitlines())}
    said = [a for a in answers if a["task"] == "understand"]
    held = {sid.split("#")[0] for sid in ParquetSampleDataset(root / "data" / "val").sample_ids()}
    assert {a["id"].split("#")[0] for a in said} <= held  # drawn from the held-out split only
    assert [a["truth"] for a in said] == [captions[a["id"].split("#")[0]] for a in said]
    assert metrics["understand/exact_match"] == sum(a["answer"] == a["truth"] for a in said) / 4
    assert 0.0 <= metrics["understand/bleu"] <= 1.0
    for task in ("understand", "t2i"):
        assert 0.0 < metrics[f"{task}/loss"] < 20.0
    t2i = [a for a in answers if a["task"] == "t2i"]
    assert [a["prompt"] for a in t2i] == [captions[a["id"].split("#")[0]] for a in t2i]
    grid = Image.open(out / "samples.png")  # per row: 12 px of prompt, then truth | generated
    assert grid.height == sum(12 + 4 * a["grid"][0] + 2 for a in t2i)
    assert grid.width >= max(2 * 4 * a["grid"][1] + 2 for a in t2i)
