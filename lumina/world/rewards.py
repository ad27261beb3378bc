"""The built-in world's rewards (conf/reward/world.yaml), each `reward(prompt, sample) -> float`:

    WorldCheck   image answers: the world's checker on the decoded 32 x 32 picture against the item's target
                 scene: the fraction of {colour, shape, size, position} it shows (`exact=true`: 1 iff all four)
    ExactMatch   text answers: 1 iff the decoded answer equals the item's answer, else 0
"""

from __future__ import annotations

from lumina.post_training.samples import Completion, RLPrompt
from lumina.world.checker import check_image
from lumina.world.dataset import cached_world_image_tokenizer, world_text_tokenizer
from lumina.world.evaluation import decode_text


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
        return float(decode_text(sample.answer_ids, self._tokenizer) == answer)
