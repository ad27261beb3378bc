"""Sampling knobs of the text and image samplers, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

GUIDANCE_TARGETS = ("hidden", "logits")


@dataclass(frozen=True)
class CacheSettings:
    """cache: run the sampler's forwards through a key/value cache of the rows the attention rule makes final
    (exact); false: the whole backbone over the whole pack at every step (the reference). cache_budget_gib: the
    most the caches of one batch of prompts may hold (a prompt that would exceed it is refused)."""

    cache: bool = True
    cache_budget_gib: float = 16.0


@dataclass(frozen=True)
class TextSamplingConfig(CacheSettings):
    """Block-diffusion text decoding; the defaults are the official text-understanding ones (contract 6.2).
    gen_length: answer budget in tokens (the last block ends at it); block_length: tokens per block; steps:
    denoising steps per block (steps beyond a block's tokens commit nothing); temperature 0 = argmax;
    threshold: commit every masked slot above it when at least the scheduled number are (contract 6.1), None
    = the scheduled most confident slots; batch_size: prompts per forward."""

    gen_length: int = 1024
    block_length: int = 32
    steps: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    threshold: float | None = None
    batch_size: int = 16
    seed: int = 65513

    def __post_init__(self) -> None:
        _check_common(self, ("gen_length", "block_length", "steps", "batch_size"))
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"TextSamplingConfig.threshold={self.threshold}: must lie in (0, 1] or be None")

    @property
    def num_blocks(self) -> int:
        return -(-self.gen_length // self.block_length)

    def block_size(self, block_index: int) -> int:
        """Slots of block `block_index`: block_length, the last one cut to end at gen_length."""
        return min(self.block_length, self.gen_length - block_index * self.block_length)


@dataclass(frozen=True)
class ImageSamplingConfig(CacheSettings):
    """Masked image generation; the defaults are the official text-to-image ones (contract 6.3; editing:
    steps=64, cfg_scale=1.0). temperature: codebook sampling and re-masking noise (0 = argmax, no noise);
    cfg_scale: single guidance scale s; text_scale / image_scale > 0 select dual guidance for editing (then
    cfg_scale must be 0); guidance: what the scales act on, "hidden" (the final hidden states) or "logits"
    (each codebook's logits, all branches fed the same sampled codes); batch_size: prompts per forward."""

    steps: int = 96
    temperature: float = 1.0
    cfg_scale: float = 3.0
    text_scale: float = 0.0
    image_scale: float = 0.0
    guidance: str = "hidden"
    top_k: int | None = None
    top_p: float | None = None
    batch_size: int = 8
    seed: int = 65513

    def __post_init__(self) -> None:
        if self.guidance not in GUIDANCE_TARGETS:
            raise ValueError(f"ImageSamplingConfig.guidance={self.guidance!r}: expected one of {GUIDANCE_TARGETS}")
        _check_common(self, ("steps", "batch_size"))
        if self.dual and self.cfg_scale != 0:
            raise ValueError(f"ImageSamplingConfig.cfg_scale={self.cfg_scale}: must be 0 when text_scale="
                             f"{self.text_scale} / image_scale={self.image_scale} select dual guidance")
        for name in ("text_scale", "image_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"ImageSamplingConfig.{name}={getattr(self, name)}: must be >= 0")

    @property
    def dual(self) -> bool:
        return self.text_scale > 0 or self.image_scale > 0


def _check_common(config: TextSamplingConfig | ImageSamplingConfig, positive: tuple[str, ...]) -> None:
    owner, temperature, top_k, top_p = type(config).__name__, config.temperature, config.top_k, config.top_p
    for name in positive:
        if not isinstance(getattr(config, name), int) or getattr(config, name) <= 0:
            raise ValueError(f"{owner}.{name}={getattr(config, name)!r}: must be a positive integer")
    if not isinstance(config.cache, bool):
        raise ValueError(f"{owner}.cache={config.cache!r}: must be true or false")
    if isinstance(config.cache_budget_gib, bool) or not isinstance(config.cache_budget_gib, int | float) \
            or not config.cache_budget_gib > 0:
        raise ValueError(f"{owner}.cache_budget_gib={config.cache_budget_gib!r}: must be a positive number of GiB")
    if temperature < 0:
        raise ValueError(f"{owner}.temperature={temperature}: must be >= 0")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"{owner}.top_k={top_k!r}: must be a non-negative integer or None")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"{owner}.top_p={top_p}: must lie in (0, 1] or be None")
