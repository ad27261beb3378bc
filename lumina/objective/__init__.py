"""The training objective: targets at the model's rows, global-token-normalised text/image CE, MoE load balancing."""

from lumina.objective.balance import balance_loss, expert_load, softmax_probs
from lumina.objective.expert_bias import find_expert_biases, sign_rule_update
from lumina.objective.labels import check_inverse_t_rows
from lumina.objective.objective import LuminaObjective
from lumina.objective.objective_config import BalanceConfig, ObjectiveConfig
from lumina.objective.result import ObjectiveResult

__all__ = [
    "BalanceConfig", "LuminaObjective", "ObjectiveConfig", "ObjectiveResult", "balance_loss", "expert_load",
    "check_inverse_t_rows", "find_expert_biases", "sign_rule_update", "softmax_probs",
]
