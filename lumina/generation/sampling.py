"""Token-level sampling primitives shared by the text and image samplers (contract section 6).

Randomness comes only from the `torch.Generator`s passed in, so a sampler is deterministic under a seed.
Gumbel noise g = -log(-log u), u ~ U(0, 1), drawn in fp64 on the logits' device.
"""

from __future__ import annotations

import math

import torch


def gumbel(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """fp64 Gumbel(0, 1) noise of `shape`."""
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

    token = argmax(logits + temperature * Gumbel) in fp64 (plain argmax at temperature 0), i.e. a draw from
    softmax(logits / temperature) after the top-k / top-p filters; confidence = softmax(filtered logits) at the
    token, computed in `confidence_dtype` (the official text sampler uses fp64, the image sampler the model's
    dtype). Rows are split into consecutive groups of `counts[i]` rows, the noise of group i drawn from
    `generators[i]` (one generator per prompt: results do not depend on how prompts are batched)."""
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


def linear_schedule(num_masked: int, steps: int) -> list[int]:
    """Tokens committed at each of `steps` steps: floor(num_masked / steps), remainder to the first steps."""
    if steps <= 0:
        raise ValueError(f"steps={steps}: must be positive")
    base, extra = divmod(num_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def cosine_keep(num_cells: int, step: int, steps: int) -> int:
    """Cells to keep masked after step `step` of `steps` (0-based): max(1, floor(N0 cos(pi/2 (k+1)/T))), 0 at
    the last step; evaluated in fp32 like the official schedule (an fp64 cos can floor differently)."""
    if steps <= 0:
        raise ValueError(f"steps={steps}: must be positive")
    if step >= steps - 1:
        return 0
    fraction = torch.cos(0.5 * math.pi * torch.tensor([(step + 1) / steps], dtype=torch.float32))
    return max(1, int(torch.floor(torch.tensor([float(num_cells)]) * fraction).item()))


def remask_lowest(score: torch.Tensor, keep: int) -> torch.Tensor:
    """score [L] of the L cells sampled this step -> bool [L], True = masked again: the cells whose score is
    below the `min(keep, L - 1)`-th smallest (0-based). At most L - 1 cells are re-masked, so every step commits
    at least one cell; equal scores at the cut stay committed (the official `mask_by_random_topk` rule)."""
    if score.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=score.device)
    cut = torch.sort(score).values[min(max(keep, 0), score.numel() - 1)]
    return score < cut
