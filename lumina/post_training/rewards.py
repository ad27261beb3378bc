"""Rewards: callables `reward(prompt: RLPrompt, sample: Completion) -> float`, one per task, each instantiated
by Hydra from `conf/reward/` (`_target_`). lumina's own, for the built-in world:

    WorldCheck   t2i / edit: the world's checker on the decoded 32 x 32 picture against the item's target
                 scene: the fraction of {colour, shape, size, position} it shows (`exact=true`: 1 iff all four)
    ExactMatch   caption / vqa / text_qa: 1 iff the decoded answer equals the item's answer, else 0

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
from lumina.world.checker import check_image
from lumina.world.dataset import cached_world_image_tokenizer, world_text_tokenizer
from lumina.world.evaluation import _decode_text

Reward = Callable[[RLPrompt, Completion], float]


class WorldCheck:
    """The world's checker on an image answer; reference: the world item (its `target` scene)."""

    def __init__(self, exact: bool = False) -> None:
        if not isinstance(exact, bool):
            raise ValueError(f"WorldCheck.exact={exact!r}: must be true or false")
        self.exact = exact
        self._tokenizer = None

    def __call__(self, prompt: RLPrompt, sample: Completion) -> float:
        target = getattr(prompt.reference, "target", None)
        if target is None or not sample.is_image:
            raise ValueError(f"WorldCheck: prompt {prompt.prompt.key!r} (task {prompt.task!r}) needs an image "
                             "answer and a world item with a target scene as its reference")
        if self._tokenizer is None:
            self._tokenizer = cached_world_image_tokenizer()
        pixels = self._tokenizer.decode(sample.codes, *prompt.prompt.grid)[0]
        score = check_image(pixels, target)
        return float(score == 1.0) if self.exact else score


class ExactMatch:
    """1.0 iff the decoded text answer equals the reference's `answer` (the world's words, as the world
    evaluation decodes them), else 0.0."""

    def __init__(self) -> None:
        self._tokenizer = None

    def __call__(self, prompt: RLPrompt, sample: Completion) -> float:
        answer = getattr(prompt.reference, "answer", None)
        if answer is None or sample.answer_ids is None:
            raise ValueError(f"ExactMatch: prompt {prompt.prompt.key!r} (task {prompt.task!r}) needs a text "
                             "answer and a reference with an `answer`")
        if self._tokenizer is None:
            self._tokenizer = world_text_tokenizer()
        return float(_decode_text(sample.answer_ids, self._tokenizer) == answer)


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
