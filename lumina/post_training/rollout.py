"""Rollouts with lumina's own samplers: G samples per prompt at temperature > 0, unguided.

Guidance: rollouts never guide. The policy the loss trains (the conditional model) is then exactly the one
that sampled, so a sampled answer's log-probability is the estimators' to compute (`experiment=rl_world`
starts from `learns_cpu`, which trains no `<uncondition>` branch, and the world is evaluated unguided).
Randomness: sample j of prompt `key` at optimizer step `step` draws from its own stream, seeded by
(seed, "key|s<step>|g<j>"): a rollout depends on nothing but the weights, the step and the prompt, so a
resumed run rolls out what the uninterrupted one did, under any batching or number of ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from lumina.contract.special_tokens import SpecialTokens
from lumina.generation.image import StepTrace, generate_images
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.sync import max_over_ranks, model_device
from lumina.generation.text import generate_text
from lumina.post_training.samples import Completion, RLPrompt


@dataclass(frozen=True)
class RolloutConfig:
    """group_size: G samples per prompt; prompts_per_step: prompts rolled out per optimizer step (per
    data-parallel rank); temperature: of every draw (> 0: the log-probabilities are under softmax(logits / T));
    text_length / block_length / text_steps: the text sampler's gen_length, block_length and steps per block;
    image_steps: the image sampler's steps; batch_size: prompts per sampler forward; seed: of every stream."""

    group_size: int = 8
    prompts_per_step: int = 4
    temperature: float = 1.0
    text_length: int = 16
    block_length: int = 16
    text_steps: int = 8
    image_steps: int = 16
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("group_size", "prompts_per_step", "text_length", "block_length", "text_steps",
                     "image_steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"rollout.{name}={value!r}: must be an integer >= 1")
        if not isinstance(self.temperature, int | float) or not self.temperature > 0:
            raise ValueError(f"rollout.temperature={self.temperature!r}: must be > 0 (RL needs sampled answers "
                             "and their log-probabilities)")

    def text_sampling(self) -> TextSamplingConfig:
        return TextSamplingConfig(gen_length=self.text_length, block_length=self.block_length,
                                  steps=self.text_steps, temperature=float(self.temperature),
                                  batch_size=self.batch_size, seed=self.seed)

    def image_sampling(self, batch_size: int) -> ImageSamplingConfig:
        return ImageSamplingConfig(steps=self.image_steps, temperature=float(self.temperature), cfg_scale=0.0,
                                   batch_size=batch_size, seed=self.seed)


def sample_key(key: int | str, step: int, index: int) -> str:
    """The random-stream key of sample `index` of prompt `key` at optimizer step `step`."""
    return f"{key}|s{step}|g{index}"


@torch.no_grad()
def rollout(model: nn.Module, prompts: list[RLPrompt], config: RolloutConfig, tokens: SpecialTokens,
            step: int) -> list[Completion]:
    """G completions per prompt, grouped (prompt i's are completions[i * G:(i + 1) * G], group i), sampled in
    eval mode (no router selection noise); the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        out: list[Completion | None] = [None] * (len(prompts) * config.group_size)
        text, image = [], []
        for i, p in enumerate(prompts):
            for j in range(config.group_size):
                request = dataclasses.replace(p.prompt, key=sample_key(p.prompt.key, step, j))
                (image if p.is_image else text).append((i * config.group_size + j, i, p, request))
        # every rank calls each sampler the same number of times (with nothing, it runs dummies in lockstep)
        answers = generate_text(model, [r for *_, r in text], tokens, config.text_sampling())
        for (slot, group, p, request), answer in zip(text, answers, strict=True):
            out[slot] = Completion(p, group, key=str(request.key), ids=list(answer.raw),
                                   block_length=config.block_length, answer_ids=list(answer.ids),
                                   commit_step=torch.tensor(answer.commit_step, dtype=torch.long))
        chunks = max_over_ranks(-(-len(image) // config.batch_size), model_device(model))
        for start in range(0, chunks * config.batch_size, config.batch_size):
            chunk = image[start:start + config.batch_size]
            trace: list[StepTrace] = []
            answers = generate_images(model, [r for *_, r in chunk], tokens,
                                      config.image_sampling(max(len(chunk), 1)), trace)
            for k, ((slot, group, p, request), answer) in enumerate(zip(chunk, answers, strict=True)):
                out[slot] = Completion(p, group, key=str(request.key), codes=answer.codes,
                                       commit_step=commit_steps(trace, k))
        return out
    finally:
        model.train(was_training)


def commit_steps(trace: list[StepTrace], index: int) -> torch.Tensor:
    """int64 [h * w]: the step at which each cell of prompt `index` was committed, from the sampler's trace."""
    still = [t.masked[index] for t in trace]
    if not still or bool(still[-1].any()):
        raise ValueError(f"trace of prompt {index}: the sampler left cells masked after its last step")
    masked = torch.stack(still)  # [steps, cells], True while masked after that step
    return (~masked).int().argmax(dim=0).long()  # the first step after which the cell is no longer masked
