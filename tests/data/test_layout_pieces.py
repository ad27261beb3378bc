"""The public pieces the generation samplers use agree with the training layout."""

from dataclasses import fields, replace

import pytest
import torch

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.layout_pieces import (
    concat_pieces,
    layout_image_answer,
    layout_prompt,
    layout_text_answer,
    media_length,
    media_rows,
)
from lumina.data.noise import NoiseConfig, cfg_dropout
from lumina.data.sequence_layout import laid_out_length, layout_eval, layout_sample

FIELDS = ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean")


def head(seq, n):
    """The first n rows of a sequence."""
    return replace(seq, **{f.name: getattr(seq, f.name)[:n] for f in fields(seq) if f.name != "sample_id"})


def assert_same(a, b, names=FIELDS):
    for f in names:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_first_text_step_equals_training_layout_fully_masked_minus_memory(tokens, random_codes):
    codes = random_codes(4)
    answer = list(range(10, 50))  # 40 tokens + EOA = 41 rows: blocks 0 (32 rows) and 1 (9 rows)
    sample = Sample("u", [Turn("system", [Text([1])]),
                          Turn("user", [Media("image", codes, (2, 2)), Text([5])]),
                          Turn("assistant", [Text(answer)])])
    train = layout_eval(sample, tokens, NoiseConfig(), seed=0, t=1.0)
    prompt = layout_prompt([Media("image", codes, (2, 2)), Text([5])], tokens, turn=0, start_position=0,
                           system=[1])
    p = len(prompt)
    masked = torch.full((41,), tokens.text_mask)
    step = concat_pieces([prompt, layout_text_answer(masked, tokens, turn=1, boa_position=p)], "u")
    assert len(train) == len(step) + 41
    assert_same(head(train, len(step)), step)
    assert step.block_ids[p + 1:].tolist() == [0] * 32 + [1] * 9  # offset // 32, BOA block 0
    assert step.position_ids[p:].tolist() == list(range(p, p + 42))


def test_later_block_step_metadata(tokens):
    """Block 1 of an answer: BOA, clean block 0 in place, noisy block 1 (first_offset = 32)."""
    prompt = layout_prompt([Text([5])], tokens)  # 3 rows
    done = layout_text_answer(list(range(10, 42)), tokens, turn=1, boa_position=3, clean=True)
    current = layout_text_answer(torch.full((32,), tokens.text_mask), tokens, turn=1, boa_position=3,
                                 with_boa=False, first_offset=32)
    seq = concat_pieces([prompt, done, current], "g")
    assert seq.position_ids.tolist() == list(range(3 + 1 + 64))
    assert seq.block_ids.tolist() == [-1] * 3 + [0] + [0] * 32 + [1] * 32
    assert seq.is_clean.tolist() == [True] * 3 + [False] + [True] * 32 + [False] * 32


def test_first_image_step_equals_training_layout_fully_masked(tokens, random_codes):
    codes = random_codes(6)
    sample = Sample("g", [Turn("user", [Text([5, 6])]), Turn("assistant", [Media("image", codes, (3, 2))])])
    train = layout_eval(sample, tokens, NoiseConfig(), seed=0, t=1.0)
    prompt = layout_prompt([Text([5, 6])], tokens)
    answer = layout_image_answer((3, 2), tokens, turn=1, start_position=len(prompt))
    step = concat_pieces([prompt, answer], "g")
    assert_same(train, step)
    uncond = layout_prompt([Text([tokens.uncondition])], tokens)  # official negative branch prompt
    assert uncond.input_ids[:, 0].tolist() == [157155, 157156, 157157]


@pytest.mark.parametrize("kind, grid", [("image", (3, 4)), ("video", (2, 3, 4)), ("mesh3d", (4, 3, 2))])
def test_media_length_matches_rows(tokens, random_codes, kind, grid):
    n = 1
    for g in grid:
        n *= g
    ids, types = media_rows(Media(kind, random_codes(n), grid), tokens)
    assert ids.shape[0] == types.shape[0] == media_length(kind, grid)
    # image: 2 + 3*5 = 17; video: 2 + 2*(3*5 + 1) = 34; mesh3d: 2 + 4*(3*3 + 1) = 42
    assert ids.shape[0] == {"image": 17, "video": 34, "mesh3d": 42}[kind]


SAMPLES = {
    "qa": [Turn("system", [Text([1, 2, 3])]), Turn("user", [Text([5])]), Turn("assistant", [Text([7] * 70)])],
    "multi": [Turn("user", [Text([5])]), Turn("assistant", [Text([7, 8])]), Turn("user", [Text([6] * 4)]),
              Turn("assistant", [Text([9] * 33)])],
    "edit": [Turn("user", [Text([5]), Media("image", torch.zeros(6, 8, dtype=torch.long), (2, 3)),
                           Text([6])]),
             Turn("assistant", [Media("image", torch.zeros(4, 8, dtype=torch.long), (2, 2))])],
    "media": [Turn("user", [Media("video", torch.zeros(8, 8, dtype=torch.long), (2, 2, 2)),
                            Media("mesh3d", torch.zeros(8, 8, dtype=torch.long), (2, 2, 2))]),
              Turn("assistant", [Text([7])])],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_laid_out_length_equals_layout_length_over_epochs(tokens, name):
    sample = Sample(name, SAMPLES[name])
    cfg = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    seen = set()
    for epoch in range(12):
        drops = cfg_dropout(0, epoch, name, cfg)
        seen.add(drops)
        assert laid_out_length(sample, tokens, *drops) == len(layout_sample(sample, tokens, cfg, 0, epoch))
    assert len(seen) > 1  # several CFG decisions were exercised
