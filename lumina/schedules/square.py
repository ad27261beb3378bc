"""MaskGIT's square masking schedule for text and images (Chang et al. 2022, "MaskGIT: Masked Generative Image
Transformer", sec. 3.3: gamma(r) = 1 - r^2, one of the concave schedules it compares with cosine and linear).

With the unmasking progress r = 1 - t: text tokens are masked with p(t) = 1 - (1 - t)^2 = t (2 - t), so
alpha(t) = (1 - t)^2 and the continuous-time ELBO weight (MDLM, Sahoo et al. 2024, eq. 10) is
    w(t) = -alpha'(t) / (1 - alpha(t)) = 2 (1 - t) / (t (2 - t)),
which falls from ~1/t near t = 0 to 0 at t = 1 (a fully masked answer carries no weight). Image answers mask
ceil(gamma(r) N) cells with r ~ U[0, 1). Both samplers keep floor(N gamma((k + 1) / T)) positions masked after
step k of T (images at least one before the last step), in exact integer arithmetic: fewer commits early, more
late, than the linear text schedule.
"""

from __future__ import annotations

import torch

from lumina.schedules.base import SCHEDULES, MaskingSchedule, steps_checked


@SCHEDULES.register("square")
class SquareSchedule(MaskingSchedule):
    """gamma(r) = 1 - r^2 for text and images."""

    def text_mask_prob(self, t: torch.Tensor) -> torch.Tensor:
        return t * (2 - t)

    def scale_text_loss(self, weight: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return weight * (2 * (1 - t) / (t * (2 - t)))

    def text_commits(self, num_masked: int, steps: int) -> list[int]:
        left = [_still_masked(num_masked, k, steps) for k in range(steps_checked(steps))]
        return [before - after for before, after in zip([num_masked, *left], left, strict=False)]

    def image_mask_ratio(self, r: float) -> float:
        return 1.0 - r * r

    def image_keep(self, num_cells: int, step: int, steps: int) -> int:
        if step >= steps_checked(steps) - 1:
            return 0
        return max(1, _still_masked(num_cells, step, steps))


def _still_masked(n: int, step: int, steps: int) -> int:
    """floor(n (1 - ((step + 1) / steps)^2)), exactly."""
    return n * (steps * steps - (step + 1) ** 2) // (steps * steps)
