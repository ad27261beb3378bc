"""The masking-schedule seam: every registered schedule's math against independent computations, the official
one's hand values, and the name's path from the config (bad names, official config.json files)."""

from __future__ import annotations

import pytest
import torch

from lumina.data.noise import NoiseConfig
from lumina.model.config import LuminaConfig
from lumina.schedules import SCHEDULES, build_schedule
from lumina.training.data_factory import build_datamodule
from lumina.training.errors import ConfigError


@pytest.mark.parametrize("name", SCHEDULES.names())
def test_elbo_weight_is_minus_alpha_prime_over_one_minus_alpha(name):
    """w(t) = -alpha'(t) / (1 - alpha(t)) with alpha = 1 - p, alpha' by a central difference in fp64."""
    schedule = build_schedule(name)
    t = torch.linspace(0.05, 0.95, 19, dtype=torch.float64)
    h = 1e-6
    alpha = lambda x: 1 - schedule.text_mask_prob(x)  # noqa: E731
    derivative = (alpha(t + h) - alpha(t - h)) / (2 * h)
    expected = -derivative / (1 - alpha(t))
    torch.testing.assert_close(schedule.scale_text_loss(torch.ones_like(t), t), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", SCHEDULES.names())
def test_mask_probability_rises_from_zero_to_one(name):
    schedule = build_schedule(name)
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    p = schedule.text_mask_prob(t)
    assert p[0] == 0 and p[-1] == 1 and bool((p.diff() > 0).all())
    ratios = [schedule.image_mask_ratio(r / 100) for r in range(101)]
    assert ratios[0] == 1 and abs(ratios[-1]) < 1e-12 and bool((torch.tensor(ratios).diff() < 0).all())


@pytest.mark.parametrize("name", SCHEDULES.names())
@pytest.mark.parametrize(("n", "steps"), [(7, 3), (32, 32), (32, 5), (5, 8), (1, 1), (100, 12)])
def test_commits_sum_to_the_masked_count_and_keeps_fall_to_zero(name, n, steps):
    schedule = build_schedule(name)
    commits = schedule.text_commits(n, steps)
    assert len(commits) == steps and sum(commits) == n and min(commits) >= 0
    keeps = [schedule.image_keep(n, k, steps) for k in range(steps)]
    assert keeps[-1] == 0 and min(keeps[:-1], default=1) >= 1 and max(keeps) <= n
    assert bool((torch.tensor([n, *keeps]).diff() <= 0).all())


def test_official_schedule_hand_values():
    official = build_schedule("official")
    t = torch.tensor([0.25, 0.5, 1.0])
    assert torch.equal(official.text_mask_prob(t), t)  # masked with probability t, bit for bit
    assert official.scale_text_loss(torch.ones(3), t).tolist() == [4.0, 2.0, 1.0]  # 1/t
    assert official.text_commits(7, 3) == [3, 2, 2]  # floor(7/3), the remainder to the first steps
    assert official.text_commits(2, 4) == [1, 1, 0, 0]
    assert official.image_mask_ratio(2 / 3) == pytest.approx(0.5)  # cos(pi/3)
    assert [official.image_keep(12, k, 4) for k in range(4)] == [11, 8, 4, 0]  # floor(12 cos(k pi/8))


def test_bad_schedule_names_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"LuminaConfig.masking_schedule='nope'.*official"):
        LuminaConfig.tiny(masking_schedule="nope")
    with pytest.raises(ValueError, match=r"NoiseConfig.schedule='nope'"):
        NoiseConfig(schedule="nope")
    data = {"sources": [{"name": "world", "path": None, "options": {"num_samples": 8}}],
            "noise": {"schedule": "official"}}
    with pytest.raises(ConfigError, match=r"data.noise.schedule='official'.*model.config.masking_schedule"):
        build_datamodule(data, LuminaConfig.tiny())


def test_an_official_config_json_reads_as_the_official_schedule_and_the_name_is_written_back():
    written = LuminaConfig.official().to_hf()
    assert written["masking_schedule"] == "official"
    official_file = {k: v for k, v in written.items() if k != "masking_schedule"}  # the released file
    config = LuminaConfig.from_hf(official_file)
    assert config.masking_schedule == "official" and "masking_schedule" not in config.extra
