"""`ObjectiveConfig`: the training objective's knobs (Hydra-instantiable; recorded in the run config)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

TEXT_WEIGHTINGS = ("none", "inverse_t")
P_SOURCES = ("router", "softmax")
AUX_SCOPES = ("batch", "sequence")


@dataclass
class BalanceConfig:
    """MoE load balancing: an auxiliary loss and/or the auxiliary-loss-free expert-bias update. selection_noise:
    std of the Gaussian noise each router adds to the scores it selects on in training mode (noisy top-k
    gating; 0 = off, the official routing); evaluation, generation and the combine weights never see it."""

    aux_coef: float = 0.0  # coefficient of the load-balance loss (0 = off)
    aux_scope: str = "batch"  # "batch" (f and P over the pack) or "sequence" (per packed segment, DeepSeek-V3)
    p_source: str = "router"  # P from the routers' own `balance_probs`, or "softmax" (the official loss's)
    bias_update: bool = True  # the sign-rule expert-bias update, once per optimizer step
    bias_rate: float = 1e-3  # its step size
    selection_noise: float = 0.0

    def __post_init__(self) -> None:
        _check_non_negative("balance.aux_coef", self.aux_coef)
        _check_non_negative("balance.bias_rate", self.bias_rate)
        _check_non_negative("balance.selection_noise", self.selection_noise)
        if self.aux_scope not in AUX_SCOPES:
            raise ValueError(f"ObjectiveConfig.balance.aux_scope={self.aux_scope!r}: must be one of {AUX_SCOPES}")
        if self.p_source == "sigmoid":
            raise ValueError("ObjectiveConfig.balance.p_source='sigmoid' was renamed 'router' (the router's own "
                             "balance_probs; the sigmoid router's are its normalised sigmoid scores, as before)")
        if self.p_source not in P_SOURCES:
            raise ValueError(f"ObjectiveConfig.balance.p_source={self.p_source!r}: must be one of {P_SOURCES}")
        if not isinstance(self.bias_update, bool):
            raise ValueError(f"ObjectiveConfig.balance.bias_update={self.bias_update!r}: must be a bool")


@dataclass
class ObjectiveConfig:
    """L = text_weight * sum(w(t) CE_text) / N_txt + image_weight * sum_cells(mean_c CE_c) / N_img + balance.

    text_weighting: "none" (w = 1, N_txt = supervised text tokens) or "inverse_t" (w(t) the masking schedule's
                    ELBO weight at the row's noise time t; N_txt = text answer tokens, masked or not).
    validate:       with inverse_t, check noise_t > 0 and answer_mask at the supervised text rows (one host
                    sync per call). The labels themselves are checked once, by the model's forward.
    post_training:  None (supervised training) or the options of the post-training mode that replaces the
                    supervised loss (`lumina.post_training.mode.PostTrainingConfig`: loss term by name,
                    estimators, inner epochs; conf/objective/grpo.yaml and its siblings).
    """

    text_weight: float = 1.0
    image_weight: float = 1.0
    text_weighting: str = "none"
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    validate: bool = True
    post_training: dict | None = None

    def __post_init__(self) -> None:
        _check_non_negative("text_weight", self.text_weight)
        _check_non_negative("image_weight", self.image_weight)
        if self.text_weighting not in TEXT_WEIGHTINGS:
            raise ValueError(f"ObjectiveConfig.text_weighting={self.text_weighting!r}: "
                             f"must be one of {TEXT_WEIGHTINGS}")
        if isinstance(self.balance, Mapping):  # Hydra passes a nested group as a mapping
            self.balance = BalanceConfig(**dict(self.balance))
        if not isinstance(self.balance, BalanceConfig):
            raise ValueError(f"ObjectiveConfig.balance={self.balance!r}: expected a BalanceConfig or a mapping")
        if self.post_training is not None and not isinstance(self.post_training, Mapping):
            raise ValueError(f"ObjectiveConfig.post_training={self.post_training!r}: expected a mapping or None")


def _check_non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"ObjectiveConfig.{name}={value!r}: must be a finite number >= 0")
