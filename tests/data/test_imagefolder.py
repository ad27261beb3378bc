"""`lumina-data build --imagefolder`: a folder of images + metadata.jsonl -> train / val shards of the chosen
tasks, a vocabulary of the captions, the tokenizers recorded; bad metadata lines named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pixel_helpers import write_imagefolder

from lumina.cli.data import main as cli_main
from lumina.contract.schema import Media, Text
from lumina.data.storage import ParquetSampleDataset
from lumina.ingest.fit_tokenizer import read_images
from lumina.ingest.imagefolder import metadata_rows, split_rows, val_files
from lumina.tokenizers.pixels import Preparation
from lumina.tokenizers.registry import load_visual_tokenizer
from lumina.tokenizers.text import WordTokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    lines = write_imagefolder(root / "pics", 12, 20, 24, seed=2)
    assert cli_main(["fit-tokenizer", str(root / "pics"), "--out", str(root / "tok"), "--image-size", "16",
                     "--codebook-size", "16", "--codebooks", "2", "--kmeans-iters", "5"]) == 0
    return root, lines


def build(root, out: str, *extra: str) -> int:
    return cli_main(["build", "--imagefolder", str(root / "pics"), "--image-tokenizer", str(root / "tok"),
                     "--out", str(root / out), "--val-fraction", "0.25", "--no-progress", *extra])


def test_imagefolder_builds_train_and_val_of_both_tasks(folder, capsys):
    root, lines = folder
    assert build(root, "out") == 0
    out = capsys.readouterr().out
    assert "wrote 18 rows to 1 shards" in out and "wrote 6 rows to 1 shards" in out  # 9 + 3 images, 2 tasks
    words = WordTokenizer.load(root / "out" / "tokenizer.json")
    system = {"t2i": "Generate an image according to the text prompt.",
              "caption": "You are a multimodal assistant. Answer directly using the provided image(s), text, and "
                         "conversation context; if there is no question, describe the image(s) clearly and "
                         "accurately."}  # infer_t2i_sft.py / infer_mmu_sft.py DEFAULT_SYSTEM_PROMPTS
    assert sorted(words.vocab[20:]) == sorted({w for line in lines for w in line["text"].split()}
                                              | {"describe", "the", "image", "."}
                                              | {w for text in system.values() for w in text.split()})
    tokenizer = load_visual_tokenizer(root / "out" / "visual_tokenizer")
    held = {line["file_name"] for line in lines} - {sid.split("#")[0] for sid in
                                                    ParquetSampleDataset(root / "out" / "train").sample_ids()}
    assert len(held) == 3
    val = ParquetSampleDataset(root / "out" / "val")
    assert sorted(val.sample_ids()) == sorted(f"{name}#{task}" for name in held for task in ("t2i", "caption"))
    captions = {line["file_name"]: line["text"] for line in lines}
    for sample in val:
        name, task = sample.id.split("#")
        pixels = read_images([root / "pics" / name], Preparation(16, 4))[0][None]
        codes = tokenizer.encode(pixels)[0][0]
        assert words.decode(sample.turns[0].parts[0].ids) == system[task]
        user, answer = sample.turns[1].parts, sample.turns[2].parts
        if task == "t2i":
            assert [type(p) for p in user + answer] == [Text, Media]
            assert words.decode(user[0].ids) == captions[name] and torch.equal(answer[0].codes, codes)
        else:
            assert [type(p) for p in user + answer] == [Media, Text, Text]
            assert torch.equal(user[0].codes, codes) and words.decode(user[1].ids) == "describe the image ."
            assert words.decode(answer[0].ids) == captions[name]
    for split in ("train", "val"):  # both record the tokenizers saved at the top of the output
        assets = ParquetSampleDataset(root / "out" / split).assets
        assert assets.visual_tokenizer.path == str(root / "out" / "visual_tokenizer")
        assert assets.text_tokenizer.path == str(root / "out" / "tokenizer.json")


def test_split_is_seeded_and_independent_of_line_order(folder, tmp_path):
    root, lines = folder
    rows = metadata_rows(root / "pics")
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    order = np.random.default_rng(0).permutation(len(lines))
    (shuffled / "metadata.jsonl").write_text("".join(json.dumps(lines[i]) + "\n" for i in order))
    assert val_files(rows, 0.25, 0) == val_files(metadata_rows(shuffled), 0.25, 0)
    assert val_files(rows, 0.25, 0) != val_files(rows, 0.25, 1)
    assert len(val_files(rows, 0.01, 0)) == 1 and val_files(rows, 0.0, 0) == set()
    splits = split_rows(rows, ["t2i"], 0.25, 0)
    assert [len(splits[s]) for s in ("train", "val")] == [9, 3]


def test_build_is_deterministic(folder):
    root, _ = folder
    assert build(root, "a") == 0 and build(root, "b", "--workers", "2", "--batch-size", "5") == 0
    for split in ("train", "val"):
        a, b = (sorted((root / d / split).glob("*.parquet")) for d in ("a", "b"))
        assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b] and len(a) == 1


def test_bad_metadata_lines_are_named(folder, tmp_path, capsys):
    root, lines = folder
    pics = tmp_path / "pics"
    pics.mkdir()
    for line in lines[:4]:
        (pics / line["file_name"]).write_bytes((root / "pics" / line["file_name"]).read_bytes())
    bad = [json.dumps(lines[0]), json.dumps({"file_name": lines[1]["file_name"]}), "{not json",
           json.dumps(lines[2]), json.dumps({"file_name": "gone.png", "text": "a ghost"}), json.dumps(lines[3])]
    (pics / "metadata.jsonl").write_text("\n".join(bad) + "\n")
    args = ["build", "--imagefolder", str(pics), "--image-tokenizer", str(root / "tok"), "--val-fraction", "0",
            "--tasks", "t2i"]
    assert cli_main([*args, "--out", str(tmp_path / "raise")]) == 2
    assert "metadata.jsonl:2: text=None: a metadata line needs a non-empty string 'text'" in capsys.readouterr().err
    assert cli_main([*args, "--out", str(tmp_path / "skip"), "--on-error", "skip"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[0].rsplit("/", 1)[-1] for line in err] == [
        "metadata.jsonl:2", "metadata.jsonl:3", "metadata.jsonl:5"]
    assert "invalid JSON" in err[1] and "gone.png does not exist" in err[2]
    assert len(ParquetSampleDataset(tmp_path / "skip" / "train")) == 3


def test_imagefolder_needs_an_image_tokenizer_and_known_tasks(folder, tmp_path, capsys):
    root, _ = folder
    assert cli_main(["build", "--imagefolder", str(root / "pics"), "--out", str(tmp_path / "o")]) == 2
    assert "--imagefolder needs --image-tokenizer" in capsys.readouterr().err
    assert build(root, "o2", "--tasks", "t2i,vqa") == 2
    assert "tasks=['t2i', 'vqa']: expected a non-empty list of ('t2i', 'caption')" in capsys.readouterr().err
    assert cli_main(["build", "--imagefolder", str(tmp_path), "--image-tokenizer", "builtin",
                     "--out", str(tmp_path / "o3")]) == 2
    assert "no metadata.jsonl" in capsys.readouterr().err



def test_hugging_face_train_and_validation_folders_are_the_splits(tmp_path, folder, capsys):
    root, _ = folder
    train = write_imagefolder(tmp_path / "hf" / "train", 5, 20, 24, seed=8)
    validation = write_imagefolder(tmp_path / "hf" / "validation", 2, 24, 20, seed=9)
    assert cli_main(["build", "--imagefolder", str(tmp_path / "hf"), "--image-tokenizer", str(root / "tok"),
                     "--out", str(tmp_path / "out"), "--tasks", "caption", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "wrote 5 rows to 1 shards" in out and "wrote 2 rows to 1 shards" in out
    words = WordTokenizer.load(tmp_path / "out" / "tokenizer.json")
    for split, lines in (("train", train), ("val", validation)):
        samples = list(ParquetSampleDataset(tmp_path / "out" / split))
        assert [words.decode(s.turns[2].parts[0].ids) for s in samples] == [line["text"] for line in lines]
        # the validation pictures are 24 x 20 (H x W): at long edge 16 they code 4 x 3 cells, train 3 x 4
        assert {s.turns[1].parts[0].grid for s in samples} == ({(3, 4)} if split == "train" else {(4, 3)})
