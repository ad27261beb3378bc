"""The text loss's ELBO weight comes from the masking schedule the model config names (the training module
builds its objective with it): hand-computed weights of the official (1/t) and square schedules."""

from __future__ import annotations

import pytest
from test_loss import CE_TEXT, batch, output

from lumina.model import LuminaConfig
from lumina.objective import ObjectiveConfig
from lumina.training.module import LuminaModule

NOISE = [0.0, 0.5, 0.5, 0.25, 0.0, 0.0, 0.0]  # text answer rows 1-3; supervised rows 1 (t = 0.5) and 3 (t = 0.25)
ANSWER = [False, True, True, True, False, False, False]


@pytest.mark.parametrize(("name", "w_half", "w_quarter"), [
    ("official", 2.0, 4.0),  # 1/t
    ("square", 4 / 3, 24 / 7),  # 2 (1 - t) / (t (2 - t)): 1 / 0.75, 1.5 / 0.4375
])
def test_the_training_objective_weighs_text_by_the_model_schedule(name, w_half, w_quarter):
    module = LuminaModule(LuminaConfig.tiny(masking_schedule=name),
                          ObjectiveConfig(text_weighting="inverse_t", image_weight=0.0))
    result = module.objective(output(), batch(noise_t=NOISE, answer_mask=ANSWER))
    expected = (CE_TEXT[0] * w_half + CE_TEXT[1] * w_quarter) / 3  # N_txt = 3 answer tokens
    assert result.text_loss.item() == pytest.approx(expected, rel=1e-6)
