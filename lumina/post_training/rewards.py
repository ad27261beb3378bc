"""Rewards: callables `reward(prompt: RLPrompt, sample: Completion) -> float`, one per task, each instantiated
by Hydra from `conf/reward/` (`_target_`). The built-in world's are in `lumina.world.rewards`.

A user's own reward is any importable function or class with that signature, e.g. in `my_pkg/rewards.py`

    def short_answer(prompt, sample):          # prompt: RLPrompt (.prompt, .task, .reference)
        return 1.0 if len(sample.answer_ids) <= 4 else 0.0     # sample: Completion

named for its task: `reward.text_qa={_target_: my_pkg.rewards.short_answer, _partial_: true}` (`_partial_`
makes Hydra hand over the function instead of calling it). `Rewards` calls the task's reward and refuses a
task without one, or a value that is not a finite number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from lumina.post_training.samples import Completion, RLPrompt

Reward = Callable[[RLPrompt, Completion], float]


class Rewards:
    """task -> reward callable (what `conf/reward/` instantiates)."""

    def __init__(self, by_task: Mapping[str, Reward]) -> None:
        for task, fn in by_task.items():
            if not callable(fn):
                raise ValueError(f"reward.{task}={fn!r}: must be a callable reward(prompt, sample) -> float")
        self.by_task = dict(by_task)

    def __call__(self, prompt: RLPrompt, sample: Completion) -> float:
        fn = self.by_task.get(prompt.task)
        if fn is None:
            raise ValueError(f"reward.{prompt.task}: no reward for task {prompt.task!r} (rewards given for "
                             f"{sorted(self.by_task)})")
        value = fn(prompt, sample)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"reward.{prompt.task} returned {value!r} for prompt {prompt.prompt.key!r}: "
                             "must be a finite number")
        return float(value)
