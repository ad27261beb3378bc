"""`experiment=own_data` (issue 23, experiments/own_data.md): the two properties of the recipe that made a small
model read its picture and stop after its caption, checked on the composed config."""

from __future__ import annotations

import torch
from train_helpers import compose_train

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import layout_sample
from lumina.model.rotary import inverse_frequencies

SAMPLE_ROWS = 90  # a 32 px picture's caption or t2i sample: 8 x 8 cells, row markers and the prompt


def slowest_turn(overrides: list[str]) -> float:
    """Radians the slowest rotary frequency turns over one sample's positions."""
    model = compose_train(overrides).model.config
    return float(inverse_frequencies(model.rotary_dim, model.get("rope_theta", 600000.0)).min()) * SAMPLE_ROWS


def test_every_rotary_frequency_tells_a_samples_positions_apart():
    """Each of the tiny model's 4 frequencies turns more than a radian across a sample under the recipe; with
    the official base (600000, made for 32 frequencies over long contexts) the slowest turns 0.004 rad, a
    position signal the model cannot read (run O3 vs O2 of experiments/own_data.md)."""
    assert slowest_turn(["experiment=own_data"]) > 1.0
    assert slowest_turn([]) < 0.01


def test_every_caption_token_and_its_end_are_supervised_in_every_epoch():
    """Text blocks of one token: every answer row, EOA included, is masked and labelled in every epoch (so
    the model learns where a caption ends, as one-token-a-block decoding reads it)."""
    noise = NoiseConfig(**compose_train(["experiment=own_data"]).data.noise)
    tokens = SpecialTokens.official(newline=201)  # any id of '\n' (a media line ends in it)
    picture = Media("image", torch.zeros(4, tokens.num_codebooks, dtype=torch.long), (2, 2))
    sample = Sample(
        "a.png#caption", [Turn("user", [picture, Text([5])]), Turn("assistant", [Text([7, 8, 9])])]
    )
    for epoch in range(20):
        seq = layout_sample(sample, tokens, noise, seed=0, epoch=epoch)
        rows = seq.answer_mask.nonzero().squeeze(1)
        assert seq.labels[rows, 0].tolist() == [7, 8, 9, tokens.eoa]
        assert (seq.input_ids[rows, 0] == tokens.text_mask).all()
    default = NoiseConfig()  # blocks of 32: some epochs leave caption tokens or EOA unsupervised
    supervised = [
        layout_sample(sample, tokens, default, seed=0, epoch=e).labels[:, 0].ne(-100).sum().item()
        for e in range(20)
    ]
    assert min(supervised) < 4
