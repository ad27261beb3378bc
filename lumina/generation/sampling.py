"""Token-level sampling primitives shared by the text and image samplers (contract section 6). Randomness
comes only from the `torch.Generator`s passed in, so a sampler is deterministic under a seed.
"""

from __future__ import annotations

import torch
from torch import nn

from lumina.data.noise import stable_seed
from lumina.schedules import MaskingSchedule, build_schedule


def seeded_generator(seed: int, key: int | str, stream: str, device: torch.device) -> torch.Generator:
    """The generator of one prompt (`key`) in one sampler's `stream` ("text" / "image")."""
    return torch.Generator(device=device).manual_seed(stable_seed(seed, key, stream))


def gumbel(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """fp64 Gumbel(0, 1) noise of `shape`: -log(-log u), u ~ U(0, 1)."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    neg_log_u = (-torch.log(u.clamp_min(1e-300))).clamp_min(1e-300)
    return -torch.log(neg_log_u)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """logits [N, V] with everything outside the top_k largest / the smallest set whose probability reaches
    top_p set to -inf (the most likely token always stays). None or 0 / 1.0 disables a filter."""
    out = logits
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits.double(), dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_logits.double(), dim=-1) >= top_p  # mass before it
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_tokens(logits: torch.Tensor, temperature: float, generators: list[torch.Generator],
                  counts: list[int], top_k: int | None = None, top_p: float | None = None,
                  confidence_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (tokens int64 [N], confidence [N] in `confidence_dtype`).
    token = argmax(filtered logits + temperature * Gumbel) in fp64, a draw from softmax(logits / temperature);
    confidence = softmax(filtered logits) at the token. Consecutive groups of `counts[i]` rows draw their
    noise from `generators[i]` (one per prompt: results do not depend on how prompts are batched)."""
    if sum(counts) != logits.shape[0] or len(counts) != len(generators):
        raise ValueError(f"counts {counts} must sum to the {logits.shape[0]} logit rows, one per generator")
    filtered = filter_top_k_top_p(logits.double(), top_k, top_p)
    scores = filtered
    if temperature > 0:
        noise = torch.cat([gumbel((n, logits.shape[-1]), g, logits.device) for n, g in zip(counts, generators,
                                                                                               strict=True)])
        scores = filtered + temperature * noise
    tokens = scores.argmax(dim=-1)
    confidence = torch.softmax(filtered.to(confidence_dtype), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, confidence


def model_schedule(model: nn.Module) -> MaskingSchedule:
    """The masking schedule `model` was trained with (its config's `masking_schedule`): the samplers' commit
    and keep counts."""
    return build_schedule(model.config.masking_schedule)


def remask_lowest(score: torch.Tensor, keep: int) -> torch.Tensor:
    """score [L] of the L cells sampled this step -> bool [L], True = masked again: the cells whose score is
    below the `min(keep, L - 1)`-th smallest (0-based). At most L - 1 cells are re-masked, so every step commits
    at least one cell; equal scores at the cut stay committed (the official `mask_by_random_topk` rule)."""
    if score.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=score.device)
    cut = torch.sort(score).values[min(max(keep, 0), score.numel() - 1)]
    return score < cut
