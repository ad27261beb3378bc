"""MoE load-balance loss and per-expert load counts, over valid tokens only.

Per MoE layer, with T valid tokens, k experts per token and E experts:
    f_i = count_i / (T * k)                  count_i = times expert i is in a valid token's top-k
    P_i = mean over valid tokens of p_i      p = the router's `balance_probs(logits)` (p_source "router")
                                               or softmax(logits) ("softmax", official 5.5)
    layer loss = E * sum_i f_i * P_i;  the loss is the mean over layers (times a coefficient, applied outside).

Scope "batch" takes f and P over the pack; "sequence" (DeepSeek-V3) per packed segment, averaging the segment
losses. Under sequence parallelism the counts are summed over `group`, each rank's P_i sums its own tokens'
p_i over the global count, and each rank returns its share times the group size (the ranks' mean is the loss).
"""

from __future__ import annotations

from collections.abc import Callable

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


ProbsFn = Callable[[torch.Tensor], torch.Tensor]  # router logits [..., E] -> fp32 probabilities [..., E]


def softmax_probs(router_logits: torch.Tensor) -> torch.Tensor:
    """router_logits [..., E] -> softmax in fp32 [..., E]: the official `load_balancing_loss_func`'s P."""
    return torch.softmax(router_logits.float(), dim=-1)


def layer_balance_loss(router_logits: torch.Tensor, topk_ids: torch.Tensor, token_valid: torch.Tensor,
                       probs_fn: ProbsFn, segment_ids: torch.Tensor | None = None,
                       num_segments: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """router_logits [B, S, E], topk_ids [B, S, k], token_valid [B, S] -> scalar E * sum_i f_i P_i, with the
    per-token probabilities p = probs_fn(router_logits) (`softmax_probs`, or a router's `balance_probs`).

    segment_ids int64 [B, S] in [0, num_segments] (num_segments = no segment, e.g. tail padding) gives the
    mean over non-empty segments of each segment's loss; None = one segment. group: the sequence-parallel
    group sharing the pack (None = none). Zero valid tokens or E <= 1 give an exact 0 in the graph (as the
    official function). No host sync."""
    num_experts = router_logits.shape[-1]
    k = topk_ids.shape[-1]
    if router_logits.shape[:-1] != token_valid.shape:
        raise ValueError(f"router_logits has shape {list(router_logits.shape)}, token_valid "
                         f"{list(token_valid.shape)}")
    if topk_ids.shape[:-1] != token_valid.shape:
        raise ValueError(f"router_topk_ids has shape {list(topk_ids.shape)}, token_valid {list(token_valid.shape)}")
    if segment_ids is not None and segment_ids.shape != token_valid.shape:
        raise ValueError(f"segment_ids has shape {list(segment_ids.shape)}, token_valid {list(token_valid.shape)}")
    if num_experts <= 1:
        return router_logits.float().sum() * 0.0
    bins = num_segments + 1  # the last bin collects tokens outside every segment (weight 0 when invalid)
    seg = (segment_ids.reshape(-1).long() if segment_ids is not None
           else torch.zeros(token_valid.numel(), dtype=torch.long, device=token_valid.device))
    valid = token_valid.reshape(-1).float()
    probs = probs_fn(router_logits).reshape(-1, num_experts) * valid[:, None]
    tokens = torch.zeros(bins, device=valid.device).index_add_(0, seg, valid)  # [bins]
    sum_p = probs.new_zeros(bins, num_experts).index_add_(0, seg, probs)  # [bins, E]
    slots = seg[:, None] * num_experts + topk_ids.reshape(-1, k).long()  # [T, k] flat (segment, expert)
    counts = torch.zeros(bins * num_experts, device=valid.device)
    counts = counts.scatter_add_(0, slots.reshape(-1), valid[:, None].expand(-1, k).reshape(-1))
    share = 1
    if group is not None:  # the pack's counts; sum_p stays this rank's (its gradient is this rank's tokens')
        stats = dp_sum(torch.cat([tokens, counts]), group)
        tokens, counts, share = stats[:bins], stats[bins:], dist.get_world_size(group)
    counts = counts.view(bins, num_experts)
    denom = tokens.clamp(min=1.0)[:, None]
    per_segment = num_experts * ((counts / (denom * k)) * (sum_p / denom)).sum(dim=-1)  # [bins]; 0 when empty
    used = (tokens[:num_segments] > 0).float()
    return (per_segment[:num_segments] * used).sum() / used.sum().clamp(min=1.0) * share


def balance_loss(router_logits: list[torch.Tensor], topk_ids: list[torch.Tensor], token_valid: torch.Tensor,
                 probs_fn: ProbsFn, segment_ids: torch.Tensor | None = None, num_segments: int = 1,
                 group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Mean over MoE layers of `layer_balance_loss` (fp32 scalar; 0 without MoE layers)."""
    if len(router_logits) != len(topk_ids):
        raise ValueError(f"router_logits has {len(router_logits)} layers, router_topk_ids {len(topk_ids)}")
    if not router_logits:
        return torch.zeros((), device=token_valid.device)
    losses = [layer_balance_loss(lg, ids, token_valid, probs_fn, segment_ids, num_segments, group)
              for lg, ids in zip(router_logits, topk_ids, strict=True)]
    return torch.stack(losses).mean()
