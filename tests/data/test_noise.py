import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from lumina.data.noise import (
    NoiseConfig,
    cfg_dropout,
    dropout_lengths,
    id_hashes,
    image_answer_noise,
    image_mask_count,
    sample_generator,
    stable_seed,
    text_answer_noise,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_stable_seed_is_the_same_in_another_process_with_another_hash_salt():
    code = "from lumina.data.noise import stable_seed; print(stable_seed(7, 3, 'sample-x', 'noise'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == stable_seed(7, 3, "sample-x", "noise")
    assert stable_seed(7, 3, "sample-x", "noise") != stable_seed(7, 4, "sample-x", "noise")


def test_streams_are_independent_generators():
    a = torch.rand(4, generator=sample_generator(1, 0, "s", "noise"))
    b = torch.rand(4, generator=sample_generator(1, 0, "s", "cfg"))
    assert not torch.equal(a, b)


def test_fixed_t_masked_fraction_matches_t():
    cfg = NoiseConfig(block_length=32)
    n, t = 32 * 200, 0.3
    (masked, t_row), = text_answer_noise([n], cfg, gen(), fixed_t=t)
    assert torch.all(t_row == torch.tensor(t, dtype=torch.float32))
    # n Bernoulli(0.3): sd of the mean = sqrt(0.21 / 6400) = 0.0057; 5 sd. The at-least-one rule changes a
    # block only with probability 0.7^32 ~ 1e-5.
    assert abs(masked.float().mean().item() - t) < 5 * math.sqrt(t * (1 - t) / n)


def test_random_t_per_block_is_constant_within_blocks_and_drives_the_mask():
    cfg = NoiseConfig(block_length=16, t_min=0.2, t_max=0.8)
    n = 16 * 400
    (masked, t_row), = text_answer_noise([n], cfg, gen(1))
    per_block = t_row.reshape(400, 16)
    assert torch.all(per_block == per_block[:, :1])  # one t per block
    assert per_block.min() >= 0.2 and per_block.max() <= 0.8
    # t ~ U[0.2, 0.8]: mean 0.5, sd 0.6/sqrt(12) = 0.173 -> sd of the mean of 400 blocks = 0.0087; 5 sd
    assert abs(per_block[:, 0].mean().item() - 0.5) < 5 * 0.173 / math.sqrt(400)
    # E[masked - t] = 0 token-wise; each term has variance t(1-t) <= 1/4 -> sd of the mean <= 0.5/sqrt(n)
    assert abs((masked.float() - t_row).mean().item()) < 5 * 0.5 / math.sqrt(n)
    # blocks with high t mask more than blocks with low t
    frac = masked.reshape(400, 16).float().mean(1)
    high, low = per_block[:, 0] > 0.6, per_block[:, 0] < 0.4
    assert frac[high].mean() > frac[low].mean() + 0.2


@pytest.mark.parametrize("t_per, expected_per_answer", [("block", [3, 1, 2]), ("sample", [1, 1, 1])])
def test_at_least_one_masked_token_per_unit(t_per, expected_per_answer):
    cfg = NoiseConfig(block_length=4, t_min=0.0, t_max=0.0, t_per=t_per)
    lengths = [9, 1, 5]  # blocks: 3, 1, 2
    out = text_answer_noise(lengths, cfg, gen(2))
    assert [int(m.sum()) for m, _ in out] == expected_per_answer
    if t_per == "block":
        m = out[0][0]
        assert [int(m[i:i + 4].sum()) for i in (0, 4, 8)] == [1, 1, 1]


def test_t_per_sample_shares_one_t_across_answers():
    cfg = NoiseConfig(block_length=4, t_min=0.1, t_max=0.9, t_per="sample")
    out = text_answer_noise([7, 12], cfg, gen(3))
    values = torch.cat([t for _, t in out]).unique()
    assert values.numel() == 1 and 0.1 <= values.item() <= 0.9


def test_fixed_t_one_masks_everything_and_bad_t_raises():
    (m, _), = text_answer_noise([10], NoiseConfig(), gen(), fixed_t=1.0)
    assert m.all()
    with pytest.raises(ValueError, match="fixed_t=1.5"):
        text_answer_noise([10], NoiseConfig(), gen(), fixed_t=1.5)


@pytest.mark.parametrize("n, ratio, expected", [(10, 0.25, 3), (10, 0.0, 1), (10, 1.0, 10), (7, 0.5, 4),
                                                (1, 0.01, 1)])
def test_image_mask_count_fixed_ratio(n, ratio, expected):
    assert image_mask_count(n, NoiseConfig(), gen(), fixed_ratio=ratio) == expected  # ceil(ratio * n) clamped to [1, n]


def test_image_mask_count_follows_the_cosine_schedule():
    n, draws = 1000, 3000
    g = gen(4)
    fractions = torch.tensor([image_mask_count(n, NoiseConfig(), g) / n for _ in range(draws)])
    # ratio = cos(pi/2 s), s ~ U[0,1): E = 2/pi, Var = 1/2 - 4/pi^2 (sd 0.308); ceil adds < 1/n
    sd_of_mean = math.sqrt(0.5 - 4 / math.pi**2) / math.sqrt(draws)
    assert abs(fractions.mean().item() - 2 / math.pi) < 5 * sd_of_mean + 1 / n
    # P(ratio > cos(pi/4)) = P(s < 1/2) = 1/2
    above = (fractions > math.cos(math.pi / 4) + 1 / n).float().mean().item()
    assert abs(above - 0.5) < 5 * 0.5 / math.sqrt(draws)
    assert fractions.min() >= 1 / n and fractions.max() <= 1.0


def test_image_answer_noise_masks_exactly_the_count():
    m = image_answer_noise(12, NoiseConfig(), gen(5), fixed_ratio=0.4)
    assert m.dtype == torch.bool and m.shape == (12,) and int(m.sum()) == 5  # ceil(4.8)


@pytest.mark.parametrize("p_text, p_image", [(0.2, 0.5), (0.0, 1.0)])
def test_cfg_dropout_rates_follow_the_probabilities(p_text, p_image):
    cfg = NoiseConfig(uncond_text_prob=p_text, uncond_image_prob=p_image)
    n = 4000
    draws = torch.tensor([cfg_dropout(11, 0, f"s{i}", cfg) for i in range(n)], dtype=torch.float64)
    rate_text, rate_image = draws.mean(0).tolist()
    both = (draws[:, 0] * draws[:, 1]).mean().item()

    def tol(p: float) -> float:
        return 5 * math.sqrt(p * (1 - p) / n)

    assert abs(rate_text - p_text) <= tol(p_text)
    assert abs(rate_image - p_image) <= tol(p_image)
    assert abs(both - p_text * p_image) <= tol(p_text * p_image)  # independent decisions


def test_cfg_dropout_is_reproducible_per_epoch_and_sample():
    cfg = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    first = [cfg_dropout(3, 1, f"s{i}", cfg) for i in range(64)]
    assert first == [cfg_dropout(3, 1, f"s{i}", cfg) for i in range(64)]
    assert first != [cfg_dropout(3, 2, f"s{i}", cfg) for i in range(64)]


@pytest.mark.parametrize("kwargs, field", [
    (dict(block_length=0), "block_length"), (dict(t_min=0.5, t_max=0.4), "t_min"),
    (dict(t_per="turn"), "t_per"), (dict(uncond_text_prob=1.2), "uncond_text_prob"),
])
def test_bad_noise_config_raises(kwargs, field):
    with pytest.raises(ValueError, match=field):
        NoiseConfig(**kwargs)


def test_id_hashes_do_not_depend_on_the_id_container():
    ids = [f"sample-{i}" for i in range(50)] + ["", "ünïcode-ß", "x" * 300]
    want = id_hashes(ids)
    assert want.dtype == np.uint64 and len(set(want.tolist())) == len(ids)
    chunked = pa.chunked_array([pa.array(["pad"] + ids[:20]), pa.array(ids[20:])]).slice(1)
    assert id_hashes(chunked).tolist() == want.tolist()
    assert id_hashes(pa.array(ids, pa.string())).tolist() == want.tolist()
    assert id_hashes(pa.array(ids, pa.large_string())[5:]).tolist() == want[5:].tolist()


def test_dropout_lengths_take_the_layouts_coins():
    """The vectorised epoch-start path picks, for every sample, the variant cfg_dropout gives the layout."""
    cfg = NoiseConfig(uncond_text_prob=0.3, uncond_image_prob=0.6)
    ids = [f"s{i}" for i in range(300)]
    stored = np.arange(1200, dtype=np.uint16).reshape(300, 4)  # variant v of sample i: 4 i + v
    for epoch in (0, 5):
        got = dropout_lengths(stored, id_hashes(ids), cfg, 11, epoch)
        want = [4 * i + dt + 2 * di for i, (dt, di) in enumerate(cfg_dropout(11, epoch, s, cfg) for s in ids)]
        assert got.dtype == np.int32 and got.tolist() == want
    with pytest.raises(ValueError, match=r"shape \[300, 3\], expected \[300, 4\]"):
        dropout_lengths(stored[:, :3], id_hashes(ids), cfg, 11, 0)
