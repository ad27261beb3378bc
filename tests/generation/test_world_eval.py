"""World evaluation pieces: the checker on tokenizer round trips, scoring and chance levels, the sample grid."""

from __future__ import annotations

import pytest
import torch

from lumina.world.checker import check_image
from lumina.world.dataset import cached_world_image_tokenizer, render_specs
from lumina.world.evaluation import answer_chance, sample_grid, score
from lumina.world.scene import ObjectSpec, combinations_in
from lumina.world.tasks import WorldItem


@pytest.fixture(scope="module")
def image_tokenizer():
    return cached_world_image_tokenizer()  # the tokenizer training and evaluation use


@pytest.fixture(scope="module")
def heldout_specs() -> list[ObjectSpec]:
    return [ObjectSpec(*c, dx=(i % 3) - 1, dy=((i // 3) % 3) - 1)
            for i, c in enumerate(combinations_in("val") + combinations_in("test"))]


def test_checker_passes_round_trips_of_ground_truth(image_tokenizer, heldout_specs):
    images = render_specs(heldout_specs)
    codes = image_tokenizer.encode(images)
    decoded = image_tokenizer.decode(codes, 8, 8)
    right = [check_image(img, spec) == 1.0 for img, spec in zip(decoded, heldout_specs, strict=True)]
    assert sum(right) / len(right) >= 0.95


def test_checker_fails_corrupted_images(image_tokenizer, heldout_specs):
    images = render_specs(heldout_specs)
    codes = image_tokenizer.encode(images)
    # (a) another scene's codes: a different colour
    colours = ["red", "green", "blue", "yellow", "magenta", "cyan", "white"]
    others = [s.with_(colour=colours[(colours.index(s.colour) + 1) % 7]) for s in heldout_specs]
    wrong_colour = image_tokenizer.decode(image_tokenizer.encode(render_specs(others)), 8, 8)
    assert all(check_image(img, s) <= 0.75 for img, s in zip(wrong_colour, heldout_specs, strict=True))
    # (b) uniformly random codes
    noise = torch.randint(0, 64, codes.shape, generator=torch.Generator().manual_seed(0))
    random_images = image_tokenizer.decode(noise, 8, 8)
    scores = [check_image(img, s) for img, s in zip(random_images, heldout_specs, strict=True)]
    assert sum(s == 1.0 for s in scores) / len(scores) < 0.05
    # (c) the first half of the cells blanked to the background's code
    blank = image_tokenizer.encode(torch.full((1, 3, 32, 32), -1.0))[0, 0]
    cut = codes.clone()
    cut[:, :32] = blank
    half = image_tokenizer.decode(cut, 8, 8)
    top = [i for i, s in enumerate(heldout_specs) if s.position.startswith("top")]
    assert all(check_image(half[i], heldout_specs[i]) < 1.0 for i in top)


def _item(task: str, prompt: str, answer: str | None = None, source=None, target=None) -> WorldItem:
    return WorldItem(f"x-{task}", task, prompt, answer, source, target)


def test_score_by_hand():
    red = ObjectSpec("circle", "red", "small", "top left")
    blue = red.with_(colour="blue")
    items = {
        "caption": [_item("caption", "describe the image .", "a small red circle at the top left", source=red)],
        "vqa": [_item("vqa", "what colour is the shape ?", "red", source=red),
                _item("vqa", "is the shape red ?", "yes", source=red)],
        "text_qa": [_item("text_qa", "what is one plus two ?", "three")],
        "t2i": [_item("t2i", "draw ...", target=red), _item("t2i", "draw ...", target=red)],
        "edit": [_item("edit", "make the shape blue .", source=red, target=blue)],
    }
    found_red = {"colour": "red", "shape": "circle", "size": "small", "position": "top left"}
    answers = {
        "caption": ["a small red circle at the top left"],
        "vqa": ["blue", "yes"],
        "text_qa": ["four"],
        "t2i": [found_red, {**found_red, "shape": "square", "size": "large"}],
        "edit": [found_red],  # copied the source: 3 of 4 attributes, the edited one wrong
    }
    m = score(items, answers)
    assert m["caption_acc"] == 1.0 and m["vqa_acc"] == 0.5 and m["text_qa_acc"] == 0.0
    assert m["understand_acc"] == pytest.approx(2 / 3)
    assert m["t2i_score"] == pytest.approx((1.0 + 0.5) / 2) and m["t2i_exact"] == 0.5
    assert m["edit_score"] == 0.75 and m["edit_exact"] == 0.0 and m["edit_changed"] == 0.0
    # chance: caption 1/378, colour question 1/7, yes/no 1/2, sums of 0..9 + 0..9 -> 19 number words
    assert m["chance/caption_acc"] == pytest.approx(1 / 378)
    assert m["chance/vqa_acc"] == pytest.approx((1 / 7 + 1 / 2) / 2)
    assert m["chance/text_qa_acc"] == pytest.approx(1 / 19)
    assert m["chance/t2i_score"] == pytest.approx((1 / 7 + 1 / 3 + 1 / 2 + 1 / 9) / 4)
    assert m["chance/edit_changed"] == pytest.approx(1 / 7)


def test_answer_chance_of_each_question_kind():
    spec = ObjectSpec("square", "green", "large", "bottom right")
    expected = {"what shape is it ?": 1 / 3, "is the shape small or large ?": 1 / 2, "where is the shape ?": 1 / 9,
                "is the shape cyan ?": 1 / 2}
    for question, chance in expected.items():
        assert answer_chance(_item("vqa", question, "x", source=spec)) == pytest.approx(chance)
    assert answer_chance(_item("text_qa", "how many sides does a square have ?", "four")) == pytest.approx(1 / 3)
    assert answer_chance(_item("text_qa", "what colour do red and blue make ?", "magenta")) == pytest.approx(1 / 7)


def test_sample_grid_layout():
    red = ObjectSpec("circle", "red", "small", "top left")
    items = {"t2i": [_item("t2i", "p", target=red)], "edit": [_item("edit", "p", source=red, target=red)]}
    generated = torch.ones(3, 32, 32)  # white
    grid = sample_grid(items, {"t2i": [generated], "edit": [generated]}, count=4, scale=2)
    assert grid.shape == (3, 2 * (64 + 2), 3 * (64 + 2))
    assert (grid[:, :64, 2 * 66:2 * 66 + 64] == 1.0).all()  # t2i row, third column: the generated image
    assert (grid[:, :64, :64] == 0.0).all()  # t2i rows have no source: black
