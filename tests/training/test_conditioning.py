"""The conditioning check (`lumina.training.conditioning`) through `lumina-train data=parquet`: a tiny model
trained on pictures whose captions were shuffled (nothing to learn from the image) is flagged, one trained on
the true pairs is not. Plain-colour pictures make the true pairs learnable in a few hundred steps."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from train_helpers import quiet, run_cli

from lumina.cli.data import main as data_main
from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.training.conditioning import ignoring_input, per_codebook, uses_input

COLOURS = {"red": (220, 40, 30), "green": (40, 190, 70), "blue": (30, 60, 210), "white": (240, 240, 240)}
FLAG = "the model ignores its input on understand"
TASKS = {"paired": "caption,t2i", "shuffled": "caption"}


def write_pictures(directory: Path, count: int, shuffled: bool) -> None:
    """`count` 16 x 16 pictures of one colour each with noise, captioned "a <colour> picture"; shuffled: the
    captions permuted (seeded), so a caption says nothing about its picture."""
    rng = np.random.default_rng(0)
    names = [list(COLOURS)[i % len(COLOURS)] for i in range(count)]
    captions = [f"a {n} picture" for n in names]
    if shuffled:
        captions = [captions[i] for i in rng.permutation(count)]
    directory.mkdir(parents=True)
    lines = []
    for i, name in enumerate(names):
        pixels = np.clip(np.array(COLOURS[name], np.float64) + rng.normal(0, 8, (16, 16, 3)), 0, 255)
        Image.fromarray(pixels.round().astype(np.uint8)).save(directory / f"{i:03d}.png")
        lines.append({"file_name": f"{i:03d}.png", "text": captions[i]})
    (directory / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict[str, tuple[str, list[dict]]]:
    """Run log and the CSV rows of val/understand/* of each run ("paired", also trained on t2i; "shuffled")."""
    root = tmp_path_factory.mktemp("conditioning")
    out = {}
    for kind in ("paired", "shuffled"):
        pics, data = root / f"pics_{kind}", root / f"data_{kind}"
        write_pictures(pics, 80, shuffled=kind == "shuffled")
        assert data_main(["fit-tokenizer", str(pics), "--out", str(root / f"tok_{kind}"), "--image-size", "16",
                          "--codebooks", "4", "--codebook-size", "64", "--kmeans-iters", "4"]) == 0
        assert data_main(["build", "--imagefolder", str(pics), "--image-tokenizer", str(root / f"tok_{kind}"),
                          "--out", str(data), "--tasks", TASKS[kind], "--val-fraction", "0.2", "--no-progress"]) == 0
        run = root / f"run_{kind}"
        done = run_cli(["data=parquet", f"data.sources.0.path={data}", "trainer.max_steps=150",
                        "trainer.val_check_interval=50", "logger=csv", "callbacks.expert_usage=null",
                        "callbacks.hf_export=null", "callbacks.checkpoint=null", "ckpt_path=null", *quiet(run)],
                       cwd=root, env={"OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        metrics = next(run.glob("csv/**/metrics.csv"))
        rows = [r for r in csv.DictReader(metrics.open()) if r.get("val/understand/gain")]
        out[kind] = (done.stdout + done.stderr, rows)
    return out


def test_a_model_trained_on_shuffled_pairs_is_flagged(trained):
    log, rows = trained["shuffled"]
    assert len(rows) == 3  # validations at steps 50, 100, 150
    gains = [float(r["val/understand/gain"]) for r in rows]
    losses = [float(r["val/understand/loss_ignoring"]) for r in rows]
    assert all(g < 0.02 * loss for g, loss in zip(gains, losses, strict=True)), gains  # the image does not help
    assert len(re.findall(FLAG, log)) == 2, log[-3000:]  # after the 2nd and 3rd flat validation (patience 2)
    assert re.search(r"understand held-out loss [\d.]+ acc [\d.]+ \| image swapped: loss [\d.]+", log)


def test_a_model_that_uses_its_image_is_not_flagged(trained):
    log, rows = trained["paired"]
    last = rows[-1]
    assert float(last["val/understand/gain"]) > 0.1 * float(last["val/understand/loss_ignoring"]), last
    assert float(last["val/understand/acc"]) > float(last["val/understand/acc_ignoring"]), last
    assert FLAG not in log, log[-3000:]


def test_the_baseline_takes_away_only_the_input_the_answer_depends_on():
    tokens = SpecialTokens.official()
    picture = Media("image", torch.zeros(4, 2, dtype=torch.long), (2, 2))
    other = Media("image", torch.ones(4, 2, dtype=torch.long), (2, 2))
    answer = Turn("assistant", [Text([7, 8])])
    caption = Sample("a#caption", [Turn("user", [picture, Text([5])]), answer])
    donor = Sample("b#caption", [Turn("user", [other, Text([5])]), answer])
    swapped = ignoring_input(caption, "understand", donor, tokens)
    assert swapped.id == "a#caption" and swapped.turns[-1] is answer
    assert swapped.turns[0].parts[0] is other and swapped.turns[0].parts[1].ids == [5]
    assert caption.turns[0].parts[0] is picture  # the original is left as it was
    t2i = Sample("a#t2i", [Turn("system", [Text([3])]), Turn("user", [Text([5, 6])]),
                           Turn("assistant", [picture])])
    dropped = ignoring_input(t2i, "t2i", donor, tokens)
    assert [p.ids for p in dropped.turns[1].parts] == [[tokens.uncondition]]
    assert dropped.turns[0] is t2i.turns[0] and dropped.turns[2].parts[0] is picture


def test_t2i_gains_are_split_by_codebook(trained):
    """The image loss is the mean over codebooks, so the per-codebook losses and gains average to the totals."""
    _, rows = trained["paired"]
    for row in rows:
        gains = [float(row[f"val/t2i/gain/cb{c}"]) for c in range(4)]
        ignoring = [float(row[f"val/t2i/loss_ignoring/cb{c}"]) for c in range(4)]
        assert abs(np.mean(gains) - float(row["val/t2i/gain"])) < 1e-4, row
        assert abs(np.mean(ignoring) - float(row["val/t2i/loss_ignoring"])) < 1e-4, row
        assert len(set(gains)) > 1, row  # the codebooks are scored apart


def test_an_over_fitted_model_is_not_flagged_while_its_first_codebook_follows_the_prompt():
    """Measured on 900 drawn glyph scans after 7000 steps (experiments/own_data.md): the total gain is below 0
    (the residual codebooks' detail is memorised), the first codebook's is 21% of its baseline, and the
    drawings show the asked digit 86% of the time. Flat in the total and every codebook: flagged."""
    scores = {"t2i/gain": -0.0159, "t2i/loss_ignoring": 3.2336,
              "t2i/gain/cb0": 0.3696, "t2i/loss_ignoring/cb0": 1.7699,
              "t2i/gain/cb1": -0.0175, "t2i/loss_ignoring/cb1": 2.9052}
    assert per_codebook(scores, "t2i/gain") == [0.3696, -0.0175]
    assert uses_input(scores, "t2i", 0.02)
    assert not uses_input({**scores, "t2i/gain/cb0": 0.03}, "t2i", 0.02)  # 0.03 < 2% of 1.7699
    assert not uses_input({"understand/gain": 0.01, "understand/loss_ignoring": 1.0}, "understand", 0.02)
    assert uses_input({"understand/gain": 0.03, "understand/loss_ignoring": 1.0}, "understand", 0.02)
