"""The released model's masking schedules: linear for text, cosine for images (contract 6.2 / 6.3).

Text: p(t) = t (alpha(t) = 1 - t), so the ELBO weight is 1/t (LLaDA's 1/t-weighted loss); the sampler commits
floor(n / steps) tokens per step, the remainder going to the first steps. Images: MaskGIT's cosine ratio
gamma(r) = cos(pi r / 2); the sampler keeps max(1, floor(N cos(pi/2 (k + 1)/T))) cells masked after step k,
evaluated in fp32 like the official sampler (an fp64 cos can floor differently), 0 after the last step.
"""

from __future__ import annotations

import math

import torch

from lumina.schedules.base import SCHEDULES, MaskingSchedule, steps_checked


@SCHEDULES.register("official", official=True)
class OfficialSchedule(MaskingSchedule):
    """Text linear (w(t) = 1/t), images cosine."""

    def text_mask_prob(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def scale_text_loss(self, weight: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return weight / t

    def text_commits(self, num_masked: int, steps: int) -> list[int]:
        base, extra = divmod(num_masked, steps_checked(steps))
        return [base + (1 if i < extra else 0) for i in range(steps)]

    def image_mask_ratio(self, r: float) -> float:
        return math.cos(math.pi / 2 * r)

    def image_keep(self, num_cells: int, step: int, steps: int) -> int:
        if step >= steps_checked(steps) - 1:
            return 0
        fraction = torch.cos(0.5 * math.pi * torch.tensor([(step + 1) / steps], dtype=torch.float32))
        return max(1, int(torch.floor(torch.tensor([float(num_cells)]) * fraction).item()))
