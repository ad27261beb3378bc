"""The masking-schedule part: one class says how much of an answer is masked at a noise level, how the text
loss weighs that level, and how the samplers unmask over their steps. Training noise (`lumina.data.noise`),
the objective's ELBO weight and both samplers read the same part, named by `LuminaConfig.masking_schedule`.

Conventions. Text: a noise time t in [0, 1] (t = 1: all masked) gives the mask probability p(t) = 1 - alpha(t)
of each answer token; the text loss of a masked token at time t is weighed by the continuous-time ELBO weight
w(t) = -alpha'(t) / (1 - alpha(t)) (MDLM, Sahoo et al. 2024, eq. 10). Images: MaskGIT's masking ratio
gamma(r) of the unmasking progress r in [0, 1] (gamma(0) = 1, gamma(1) = 0; Chang et al. 2022, sec. 3.2):
training masks ceil(gamma(r) N) of an answer's N cells with r ~ U[0, 1), and the image loss is the plain mean
over masked cells (no weight), as in MaskGIT and the official recipe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from lumina.parts import Registry

SCHEDULES = Registry("masking schedule", "lumina.schedules")
DEFAULT_SCHEDULE = "official"  # the released model's (`official.OfficialSchedule`)


class MaskingSchedule(ABC):
    """Protocol of a masking schedule. Subclasses register with `@SCHEDULES.register(name)`."""

    @abstractmethod
    def text_mask_prob(self, t: torch.Tensor) -> torch.Tensor:
        """t [n] float32 noise times -> [n] mask probabilities p(t) = 1 - alpha(t), in [0, 1]."""

    @abstractmethod
    def scale_text_loss(self, weight: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """weight [n] per-row loss weights, t [n] the rows' noise times (> 0) -> weight * w(t), w the ELBO weight
        -alpha'(t) / (1 - alpha(t))."""

    @abstractmethod
    def text_commits(self, num_masked: int, steps: int) -> list[int]:
        """Tokens the text sampler commits at each of `steps` steps of a block of `num_masked` masked slots
        ([steps] non-negative ints summing to num_masked)."""

    @abstractmethod
    def image_mask_ratio(self, r: float) -> float:
        """gamma(r): the fraction of an image answer's cells masked in training at progress r ~ U[0, 1)."""

    @abstractmethod
    def image_keep(self, num_cells: int, step: int, steps: int) -> int:
        """Cells the image sampler keeps masked after step `step` (0-based) of `steps`, of `num_cells`; 0 after
        the last step, at least 1 before it."""


def build_schedule(name: str, field: str = "LuminaConfig.masking_schedule") -> MaskingSchedule:
    """The masking schedule registered as `name` (or at a dotted path); a bad name raises naming `field`."""
    return SCHEDULES.build(name, field)


def steps_checked(steps: int) -> int:
    if steps <= 0:
        raise ValueError(f"steps={steps}: must be positive")
    return steps
