"""ObjectiveConfig: Hydra instantiation, recorded values, and field errors."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lumina.objective import BalanceConfig, ObjectiveConfig


def test_hydra_instantiates_nested_balance() -> None:
    node = OmegaConf.create({"_target_": "lumina.objective.ObjectiveConfig", "text_weight": 0.5,
                             "text_weighting": "inverse_t",
                             "balance": {"aux_coef": 0.001, "aux_scope": "sequence", "p_source": "softmax",
                                         "bias_update": False, "bias_rate": 0.002, "selection_noise": 0.03}})
    cfg = instantiate(node)
    assert isinstance(cfg, ObjectiveConfig) and isinstance(cfg.balance, BalanceConfig)
    assert dataclasses.asdict(cfg) == {"text_weight": 0.5, "image_weight": 1.0, "text_weighting": "inverse_t",
                             "balance": {"aux_coef": 0.001, "aux_scope": "sequence", "p_source": "softmax",
                                         "bias_update": False, "bias_rate": 0.002, "selection_noise": 0.03},
                             "validate": True, "post_training": None}


@pytest.mark.parametrize("kwargs,field", [
    ({"text_weighting": "linear"}, "text_weighting"),
    ({"text_weight": -1.0}, "text_weight"),
    ({"image_weight": float("nan")}, "image_weight"),
    ({"balance": {"p_source": "relu"}}, "p_source"),
    ({"balance": {"aux_coef": -0.1}}, "aux_coef"),
    ({"balance": {"bias_rate": float("inf")}}, "bias_rate"),
    ({"balance": {"aux_scope": "token"}}, "aux_scope"),
    ({"balance": {"selection_noise": -0.01}}, "selection_noise"),
    ({"balance": 3}, "balance"),
])
def test_bad_values_raise_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ObjectiveConfig(**kwargs)


def test_the_old_p_source_name_fails_naming_its_new_name() -> None:
    with pytest.raises(ValueError, match=r"p_source='sigmoid' was renamed 'router'"):
        ObjectiveConfig(balance={"p_source": "sigmoid"})
