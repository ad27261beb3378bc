"""What a rollout produces: `RLPrompt` (a request, its task and what the reward checks it against) and
`Completion` (one sampled answer of it, with what the likelihood estimators need to score it again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lumina.generation.sequences import Prompt


@dataclass
class RLPrompt:
    """prompt: the sampler's request (`grid` set for an image answer); task: a name of the task table
    (`lumina.contract.tasks`) or a user's own; reference: what the task's reward compares against (the world's `WorldItem`, or
    a user's own object)."""

    prompt: Prompt
    task: str
    reference: Any = None

    @property
    def is_image(self) -> bool:
        return self.prompt.grid is not None


@dataclass
class Completion:
    """One sampled answer. group: index of its prompt in the rollout batch (the G samples of a prompt share it);
    key: its random stream's key (unique per prompt, step and sample; seeds its views too).
    Text: `ids`, every decoded token (EOA and what follows it in its block included: what the sampler chose),
    in blocks of `block_length`; `answer_ids`, the answer the user reads (the tokens before the first EOA);
    `commit_step` [len(ids)] int64, the step of its block at which each token was committed. Image: `codes`
    [h * w, C] in row-major cell order and `commit_step` [h * w] int64, the sampler step at which each cell was
    committed (its codes were drawn in that step)."""

    prompt: RLPrompt
    group: int
    key: str = ""
    ids: list[int] | None = None
    block_length: int = 0
    answer_ids: list[int] | None = None
    codes: torch.Tensor | None = None
    commit_step: torch.Tensor | None = None
    reward: float = 0.0

    @property
    def is_image(self) -> bool:
        return self.codes is not None

    @property
    def num_tokens(self) -> int:
        """Scored units: answer tokens, or image cells."""
        return int(self.codes.shape[0]) if self.is_image else len(self.ids)

    def blocks(self) -> list[tuple[int, int]]:
        """Text: (start, stop) offsets of each decoded block."""
        n, b = len(self.ids), self.block_length
        return [(s, min(s + b, n)) for s in range(0, n, b)]
