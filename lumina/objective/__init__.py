"""The training objective: label normalisation, global-token-normalised text/image CE, MoE load balancing."""

from lumina.objective.balance import balance_loss, expert_load, softmax_probs
from lumina.objective.config import BalanceConfig, ObjectiveConfig
from lumina.objective.expert_bias import find_expert_biases, sign_rule_update
from lumina.objective.labels import normalize_labels, validate_supervision
from lumina.objective.objective import LuminaObjective
from lumina.objective.result import ObjectiveResult

__all__ = [
    "BalanceConfig", "LuminaObjective", "ObjectiveConfig", "ObjectiveResult", "balance_loss", "expert_load",
    "find_expert_biases", "normalize_labels", "sign_rule_update", "softmax_probs", "validate_supervision",
]
