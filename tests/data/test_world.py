"""The built-in scene world: rendering, ground truth, splits, tasks, tokenised samples and the checker."""

from __future__ import annotations

import pytest
import torch
from sample_helpers import assert_samples_equal

from lumina.cli.data import main as cli_main
from lumina.contract.schema import Media, Text
from lumina.data.storage import ParquetSampleDataset
from lumina.tokenizers import RVQSettings, WordTokenizer
from lumina.world.checker import check_image, classify_image
from lumina.world.dataset import build_world, fit_world_image_tokenizer
from lumina.world.scene import SPLIT_OF, SPLITS, ObjectSpec, all_combinations, combinations_in, render
from lumina.world.tasks import TEXT_QA_BY_SPLIT, caption, edit_instruction, make_items, task_counts

SMALL = RVQSettings(kmeans_iters=8)


@pytest.fixture(scope="module")
def image_tokenizer():
    return fit_world_image_tokenizer(SMALL, num_images=300)


def test_render_by_hand():
    """A small (8 px) red square centred at (8, 8): pixels 4..11 in x and y, red channel only."""
    image = render(ObjectSpec("square", "red", "small", "top left"))
    expected = -torch.ones(3, 32, 32)
    expected[0, 4:12, 4:12] = 1
    assert torch.equal(image, expected)
    shifted = render(ObjectSpec("square", "red", "small", "top left", dx=1, dy=-1))
    assert torch.equal(shifted, expected.roll((-1, 1), dims=(1, 2)))
    triangle = render(ObjectSpec("triangle", "blue", "large", "bottom right"))[2] > 0
    rows = triangle.sum(1)
    assert rows[17:31].tolist() == sorted(rows[17:31].tolist()) and int(rows.sum()) < 14 * 14 * 0.6  # apex up


def test_texts_by_hand():
    spec = ObjectSpec("circle", "red", "small", "top left")
    assert caption(spec) == "a small red circle at the top left"
    assert edit_instruction(spec, spec.with_(colour="blue")) == "make the shape blue ."
    assert edit_instruction(spec, spec.with_(position="bottom right")) == "move the shape to the bottom right ."
    assert edit_instruction(spec, spec.with_(shape="square")) == "turn the shape into a square ."
    with pytest.raises(ValueError, match="exactly one attribute"):
        edit_instruction(spec, spec.with_(colour="blue", size="large"))
    with pytest.raises(ValueError, match="ObjectSpec.colour='orange'"):
        ObjectSpec("circle", "orange", "small", "top left")


def test_splits_are_disjoint_and_cover_every_combination():
    parts = [set(combinations_in(s)) for s in SPLITS]
    assert sum(map(len, parts)) == len(all_combinations()) == 3 * 7 * 2 * 9
    assert set.union(*parts) == set(all_combinations())
    assert all(not (a & b) for i, a in enumerate(parts) for b in parts[i + 1:])
    assert len(parts[1]) == len(parts[2]) == 37
    questions = [{q for q, _ in TEXT_QA_BY_SPLIT[s]} for s in SPLITS]
    assert all(not (a & b) for i, a in enumerate(questions) for b in questions[i + 1:])


def test_items_stay_inside_their_split():
    for split in SPLITS:
        items = make_items(split, 400, seed=3)
        for item in items:
            for spec in (item.source, item.target):
                assert spec is None or SPLIT_OF[spec.combination] == split, (split, item)
            if item.task == "text_qa":
                assert (item.prompt, item.answer) in TEXT_QA_BY_SPLIT[split]


def test_items_are_deterministic_and_seeded():
    assert make_items("train", 200, seed=5) == make_items("train", 200, seed=5)
    assert make_items("train", 200, seed=5) != make_items("train", 200, seed=6)
    counts = task_counts(200, {"caption": 1, "vqa": 1, "t2i": 1, "edit": 1, "text_qa": 1})
    assert counts == {"caption": 40, "vqa": 40, "t2i": 40, "edit": 40, "text_qa": 40}
    assert task_counts(7, {"t2i": 2.0, "edit": 1.0}) == {"t2i": 5, "edit": 2}  # 4.67 / 2.33 -> largest remainder
    only = make_items("val", 30, seed=0, mix={"edit": 1.0})
    assert {i.task for i in only} == {"edit"}
    with pytest.raises(ValueError, match="num_items=-1"):
        make_items("train", -1)
    with pytest.raises(ValueError, match="split='dev'"):
        make_items("dev", 10)
    with pytest.raises(ValueError, match="unknown tasks"):
        make_items("train", 10, mix={"poetry": 1.0})


def test_item_ground_truth_matches_the_texts():
    for item in make_items("train", 300, seed=0):
        if item.task == "caption":
            assert item.answer == caption(item.source)
        elif item.task == "t2i":
            assert item.prompt == f"draw {caption(item.target)} ."
        elif item.task == "edit":
            changed = [a for a in ("shape", "colour", "size", "position")
                       if getattr(item.source, a) != getattr(item.target, a)]
            assert len(changed) == 1 and getattr(item.target, changed[0]) in item.prompt
        elif item.task == "vqa":
            truth = {item.source.colour, item.source.shape, item.source.size, item.source.position, "yes", "no"}
            assert item.answer in truth


def test_built_samples_have_the_task_structure(image_tokenizer):
    world = build_world("val", 60, seed=2, image_tokenizer=image_tokenizer)
    words = world.text_tokenizer
    assert len(world.dataset) == 60 and world.tokens.num_codebooks == 4 and world.tokens.codebook_size == 64
    for item, sample in zip(world.items, world.dataset.samples, strict=True):
        system, user, answer = sample.turns
        assert (system.role, user.role, answer.role) == ("system", "user", "assistant")
        assert (sample.id, sample.source) == (item.id, "world")
        expected_system = {"caption": "answer about the image .", "vqa": "answer about the image .",
                           "text_qa": "answer the question .", "t2i": "draw the image .", "edit": "edit the image ."}
        assert words.decode(system.parts[0].ids) == expected_system[item.task]
        assert isinstance(user.parts[-1], Text) and words.decode(user.parts[-1].ids) == item.prompt
        assert (item.source is not None) == isinstance(user.parts[0], Media)
        if item.target is not None:
            (image,) = answer.parts
            assert image.grid == (8, 8) and image.codes.shape == (64, 4)
            decoded = image_tokenizer.decode(image.codes[None], 8, 8)[0]
            assert check_image(decoded, item.target) == 1.0
        else:
            assert words.decode(answer.parts[0].ids) == item.answer
    lengths = world.dataset.laid_out_lengths()
    assert lengths.shape == (60, 4) and (lengths > 0).all()


def test_built_world_is_deterministic(image_tokenizer, tmp_path):
    a = build_world("train", 40, seed=9, image_tokenizer=image_tokenizer)
    b = build_world("train", 40, seed=9, image_tokenizer=image_tokenizer)
    for x, y in zip(a.dataset.samples, b.dataset.samples, strict=True):
        assert_samples_equal(x, y)
    a.dataset.save(tmp_path)
    back = ParquetSampleDataset(tmp_path, a.tokens)
    assert_samples_equal(back[7], a.dataset[7])


def test_checker_passes_every_ground_truth_scene():
    for combo in all_combinations():
        for dx, dy in ((0, 0), (-1, 1), (1, -1)):
            spec = ObjectSpec(*combo, dx=dx, dy=dy)
            assert check_image(render(spec), spec) == 1.0, spec


def test_checker_scores_each_wrong_attribute():
    spec = ObjectSpec("triangle", "green", "large", "middle center")
    assert check_image(render(spec.with_(colour="cyan")), spec) == 0.75
    assert check_image(render(spec.with_(shape="circle")), spec) == 0.75
    assert check_image(render(spec.with_(size="small")), spec) == 0.75
    assert check_image(render(spec.with_(position="top right", colour="red")), spec) == 0.5
    assert check_image(-torch.ones(3, 32, 32), spec) == 0.0
    assert classify_image(render(spec)) == {"colour": "green", "shape": "triangle", "size": "large",
                                            "position": "middle center"}
    with pytest.raises(ValueError, match=r"pixels has shape \[32, 32, 3\]"):
        check_image(torch.zeros(32, 32, 3), spec)


def test_cli_world_writes_shards_and_tokenizers(tmp_path, capsys):
    out = tmp_path / "world"
    args = ["world", "--out", str(out), "--split", "test", "--num-samples", "20", "--codebook-size", "16",
            "--num-codebooks", "2", "--patch-size", "8", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "wrote 20 test samples" in printed and "checker pass rate" in printed
    ds = ParquetSampleDataset(out)
    assert len(ds) == 20 and ds.tokens.codebook_size == 16 and ds.tokens.num_codebooks == 2
    assert WordTokenizer.load(out / "tokenizer.json").vocab_size == ds.tokens.text_vocab_size
    assert (out / "image_tokenizer.safetensors").is_file()
