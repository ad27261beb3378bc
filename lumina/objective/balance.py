"""MoE load-balance loss and per-expert load counts, over valid tokens only.

Per MoE layer, with T valid tokens, k experts per token and E experts:
    f_i = count_i / (T * k)                  count_i = times expert i is in a valid token's top-k
    P_i = mean over valid tokens of p_i      p = s / sum_j s_j, s = sigmoid(logits)   ("sigmoid")
                                             p = softmax(logits)                      ("softmax", official 5.5)
    layer loss = E * sum_i f_i * P_i;  the loss is the mean over layers (times a coefficient, applied outside).

With sequence parallelism a pack's tokens are spread over the ranks of `group`: the counts and T are summed
over the group, each rank's P_i sums its own tokens' p_i over the global T, and each rank returns its share
times the group size, so the ranks' mean (what gradient averaging takes) is the loss of the whole pack.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lumina.objective.reduce import dp_sum


def expert_counts(topk_ids: torch.Tensor, token_valid: torch.Tensor, num_experts: int) -> torch.Tensor:
    """topk_ids [B, S, k], token_valid [B, S] -> float32 [E] top-k selections by valid tokens (no host sync)."""
    k = topk_ids.shape[-1]
    if topk_ids.shape[:-1] != token_valid.shape:
        raise ValueError(f"router_topk_ids has shape {list(topk_ids.shape)}, token_valid {list(token_valid.shape)}")
    weights = token_valid.reshape(-1, 1).expand(-1, k).float().reshape(-1)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=topk_ids.device)
    return counts.scatter_add_(0, topk_ids.reshape(-1).long(), weights)


def expert_load(topk_ids: list[torch.Tensor], token_valid: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per MoE layer counts: list of [B, S, k] -> float32 [L, E] (detached)."""
    if not topk_ids:
        return torch.zeros(0, num_experts, device=token_valid.device)
    with torch.no_grad():
        return torch.stack([expert_counts(ids, token_valid, num_experts) for ids in topk_ids])


def router_probs(router_logits: torch.Tensor, p_source: str) -> torch.Tensor:
    """router_logits [..., E] -> fp32 per-token expert probabilities [..., E] (rows sum to 1)."""
    logits = router_logits.float()
    if p_source == "softmax":
        return torch.softmax(logits, dim=-1)
    if p_source == "sigmoid":
        scores = torch.sigmoid(logits)
        return scores / scores.sum(dim=-1, keepdim=True)
    raise ValueError(f"p_source={p_source!r}: must be 'sigmoid' or 'softmax'")


def layer_balance_loss(router_logits: torch.Tensor, topk_ids: torch.Tensor, token_valid: torch.Tensor,
                       p_source: str, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """router_logits [B, S, E], topk_ids [B, S, k], token_valid [B, S] -> scalar E * sum_i f_i P_i (this
    rank's share times the size of `group`, the sequence-parallel group; None = this rank holds the pack).
    Zero valid tokens, or E <= 1 (nothing to balance; the official function returns 0 there too), give an
    exact 0 that stays in the graph."""
    return balance_loss([router_logits], [topk_ids], token_valid, p_source, group)


def balance_loss(router_logits: list[torch.Tensor], topk_ids: list[torch.Tensor], token_valid: torch.Tensor,
                 p_source: str, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Mean over MoE layers of the layer loss (fp32 scalar; 0 without MoE layers). One all_reduce of the
    counts over `group` when given."""
    if len(router_logits) != len(topk_ids):
        raise ValueError(f"router_logits has {len(router_logits)} layers, router_topk_ids {len(topk_ids)}")
    if not router_logits:
        return torch.zeros((), device=token_valid.device)
    for logits in router_logits:
        if logits.shape[:-1] != token_valid.shape:
            raise ValueError(f"router_logits has shape {list(logits.shape)}, token_valid {list(token_valid.shape)}")
    num_experts, k = router_logits[0].shape[-1], topk_ids[0].shape[-1]
    if num_experts <= 1:
        return torch.stack([lg.float().sum() for lg in router_logits]).sum() * 0.0
    valid = token_valid.reshape(-1, 1).float()
    counts = torch.cat([expert_load(topk_ids, token_valid, num_experts).reshape(-1), valid.sum().reshape(1)])
    share = 1
    if group is not None:
        counts, share = dp_sum(counts, group), dist.get_world_size(group)
    num_valid = counts[-1].clamp(min=1.0)
    f = counts[:-1].view(len(topk_ids), num_experts) / (num_valid * k)  # [L, E]
    losses = []
    for layer, logits in enumerate(router_logits):
        probs = router_probs(logits, p_source).reshape(-1, num_experts)
        mean_p = (probs * valid).sum(0) / num_valid  # this rank's tokens' part of P
        losses.append(num_experts * (f[layer] * mean_p).sum())
    return torch.stack(losses).mean() * share
