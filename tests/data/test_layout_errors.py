"""Bad samples raise ValueError naming the sample id and the field."""

import pytest
import torch

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import check_sample, laid_out_length, layout_sample


def img(h=1, w=2, bad_code=None):
    """A valid random image grid; `bad_code` (if given) is written into one cell, deterministically."""
    codes = torch.randint(0, 4096, (h * w, 8))
    if bad_code is not None:
        codes[-1, 3] = bad_code
    return Media("image", codes, (h, w))


CASES = {
    "assistant first": ([Turn("assistant", [Text([10])])], r"turns\[0\]\.role='assistant', expected 'user'"),
    "two users": ([Turn("user", [Text([5])]), Turn("user", [Text([6])])],
                  r"turns\[1\]\.role='user', expected 'assistant'"),
    "system later": ([Turn("user", [Text([5])]), Turn("system", [Text([6])])],
                     r"turns\[1\]\.role='system'"),
    "no answer": ([Turn("user", [Text([5])])], r"turns\[0\] is a user turn with no assistant answer"),
    "only system": ([Turn("system", [Text([5])])], r"turns has no user/assistant exchange"),
    "text and image answer": ([Turn("user", [Text([5])]), Turn("assistant", [Text([10]), img()])],
                              r"turns\[1\]\.parts has 2 parts incl\. media"),
    "video answer": ([Turn("user", [Text([5])]),
                      Turn("assistant", [Media("video", torch.zeros(2, 8, dtype=torch.long), (1, 1, 2))])],
                     r"turns\[1\]\.parts\[0\]\.kind='video'"),
    "empty answer": ([Turn("user", [Text([5])]), Turn("assistant", [])], r"turns\[1\]\.parts: the assistant"),
    "image answer then more": ([Turn("user", [Text([5])]), Turn("assistant", [img()]),
                                Turn("user", [Text([6])]), Turn("assistant", [Text([7])])],
                               r"turns\[1\] is an image answer but more turns follow"),
    "media in system": ([Turn("system", [img()]), Turn("user", [Text([5])]), Turn("assistant", [Text([7])])],
                        r"turns\[0\]\.parts\[0\] is Media; a system turn holds text only"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_structure_raises_in_layout_and_length(tokens, name):
    turns, pattern = CASES[name]
    sample = Sample("bad-1", turns)
    with pytest.raises(ValueError, match=r"sample 'bad-1': " + pattern):
        layout_sample(sample, tokens, NoiseConfig(), seed=0, epoch=0)
    with pytest.raises(ValueError, match=r"sample 'bad-1': " + pattern):
        laid_out_length(sample, tokens)


VALUE_CASES = {
    "code out of range": ([Turn("user", [img(bad_code=4096)]), Turn("assistant", [Text([10])])],
                          r"turns\[0\]\.parts\[0\]\.codes has values outside \[0, 4096\)"),
    "answer code out of range": ([Turn("user", [Text([5])]),
                                  Turn("assistant", [Media("image", torch.full((2, 8), 5001), (1, 2))])],
                                 r"turns\[1\]\.parts\[0\]\.codes has values outside"),
    "grid mismatch": ([Turn("user", [Media("image", torch.zeros(3, 8, dtype=torch.long), (1, 2))]),
                       Turn("assistant", [Text([10])])], r"turns\[0\]\.parts\[0\]\.codes has 3 cells"),
    "wrong codebooks": ([Turn("user", [Media("image", torch.zeros(2, 4, dtype=torch.long), (1, 2))]),
                         Turn("assistant", [Text([10])])],
                        r"turns\[0\]\.parts\[0\]\.codes has shape \[2, 4\]"),
    "text id too large": ([Turn("user", [Text([157184])]), Turn("assistant", [Text([10])])],
                          r"turns\[0\]\.parts\[0\]\.ids has values outside \[0, 157184\)"),
    "negative text id": ([Turn("user", [Text([5])]), Turn("assistant", [Text([-1])])],
                         r"turns\[1\]\.parts\[0\]\.ids has values outside"),
    "EOA in answer text": ([Turn("user", [Text([5])]), Turn("assistant", [Text([10, 157166])])],
                           r"turns\[1\]\.parts\[0\]\.ids contains ids the layout reserves.*157166"),
    "mask id in prompt": ([Turn("user", [Text([156895])]), Turn("assistant", [Text([10])])],
                          r"turns\[0\]\.parts\[0\]\.ids contains ids the layout reserves"),
}


@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_bad_values_raise(tokens, name):
    turns, pattern = VALUE_CASES[name]
    with pytest.raises(ValueError, match=r"sample 'bad-2': " + pattern):
        layout_sample(Sample("bad-2", turns), tokens, NoiseConfig(), seed=0, epoch=0)


def test_bad_grid_raises_in_length(tokens):
    sample = Sample("bad-3", [Turn("user", [Media("image", torch.zeros(0, 8, dtype=torch.long), (0, 2))]),
                              Turn("assistant", [Text([10])])])
    pattern = r"sample 'bad-3': turns\[0\]\.parts\[0\]: kind='image' grid=\(0, 2\)"
    with pytest.raises(ValueError, match=pattern):
        laid_out_length(sample, tokens)


def test_check_sample_makes_the_layout_checks_without_building(tokens):
    from lumina.data.sequence_layout import check_sample

    good = Sample("ok", [Turn("user", [Text([5])]), Turn("assistant", [Text([10])])])
    check_sample(good, tokens)
    turns, pattern = VALUE_CASES["EOA in answer text"]
    with pytest.raises(ValueError, match=r"sample 'bad-4': " + pattern):
        check_sample(Sample("bad-4", turns), tokens)


def test_placeholders_must_match_the_media(tokens):
    """A placeholder in user text binds the turn's next media part of its kind; a placeholder without media, or
    media left over once the text holds placeholders, is an error naming the sample and turn."""
    img = Media("image", torch.zeros(1, 8, dtype=torch.long), (1, 1))
    two = Sample("p", [Turn("user", [Text([tokens.img_context, 7, tokens.img_context]), img]),
                       Turn("assistant", [Text([5])])])
    with pytest.raises(ValueError, match=r"sample 'p': turns\[0\]: a image placeholder .* no image media part left"):
        check_sample(two, tokens)
    extra = Sample("q", [Turn("user", [Text([7, tokens.img_context]), img, img]), Turn("assistant", [Text([5])])])
    with pytest.raises(ValueError, match=r"sample 'q': turns\[0\]: the text holds placeholders but \{'image': 1\}"):
        check_sample(extra, tokens)
    no_newline = Sample("r", [Turn("user", [img, Text([7])]), Turn("assistant", [Text([5])])])
    with pytest.raises(ValueError, match=r"sample 'r'.*SpecialTokens.newline is unset"):
        check_sample(no_newline, tokens.replace(newline=-1))
