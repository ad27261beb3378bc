"""The training objective: targets at the model's rows, global-token-normalised text/image CE, MoE load balancing."""

from lumina.objective.balance import (
    balance_loss,
    expert_counts,
    expert_load,
    layer_balance_loss,
    softmax_probs,
)
from lumina.objective.config import BalanceConfig, ObjectiveConfig
from lumina.objective.expert_bias import ExpertBiasUpdater, find_expert_biases, sign_rule_update
from lumina.objective.labels import check_inverse_t_rows, gather_targets
from lumina.objective.objective import LuminaObjective
from lumina.objective.reduce import dp_sum, dp_world_size
from lumina.objective.result import ObjectiveResult

__all__ = [
    "BalanceConfig", "ExpertBiasUpdater", "LuminaObjective", "ObjectiveConfig", "ObjectiveResult",
    "balance_loss", "check_inverse_t_rows", "dp_sum", "dp_world_size", "expert_counts", "expert_load", "find_expert_biases",
    "gather_targets", "layer_balance_loss", "sign_rule_update", "softmax_probs",
]
