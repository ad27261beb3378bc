"""Image heads: the part between the backbone's hidden state at a supervised image row and the C codebook
heads (`lm_img_head.{c}`, held by the LM). One class per head behind `ImageHead`, registered by name in
`IMAGE_HEADS` and chosen by `LuminaConfig.image_head` (official: `channel_ar`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.parts import Registry

IMAGE_HEADS = Registry("image head", "lumina.model.image_heads")

# sample_fn(logits [N, K], codebook c) -> (tokens int64 [N], probabilities [N])
SampleFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ImageHeadMACs:
    """Multiply-adds of an image head per supervised image row: its linear layers, its attention products."""

    linears: int
    attention: int


class ImageHead(nn.Module):
    """The contract of an image head (all rows independent; D = hidden_size feeds `lm_img_head[c]`).

    module_name     the LM's attribute holding the head, so the prefix of its checkpoint keys
    teacher_forced  whether training feeds it the embeddings of the target codes 0..C-2
    forward(h [N, H], code_embeds [N, C - 1, H]) -> states [N, C, D]: training; state c feeds lm_img_head[c]
                    (code_embeds has 0 rows and is not read when the head is not teacher_forced)
    run(*rows)      the row-wise computation activation checkpointing wraps, in chunks along dim 0 of every
                    argument (`lumina.model.checkpointing`); forward and sample go through it
    sample(h [N, H], sample_fn, img_embeddings, lm_img_head) -> codes int64 [N, C], probabilities [N, C]
    state_shapes(config) -> {key under module_name: shape}, every persistent tensor (checkpoint/keys.py)
    buffer_dtypes   {key under module_name: dtype} of buffers kept in a fixed dtype whatever the model's
    macs_per_row()  `ImageHeadMACs` (model/flops.py); its activation memory is measured by running forward
                    on the meta device (training/memory_estimate.py)
    """

    module_name: ClassVar[str]
    teacher_forced: ClassVar[bool]
    buffer_dtypes: ClassVar[dict[str, torch.dtype]] = {}

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.num_codebooks = config.num_codebooks

    def run(self, *rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, h: torch.Tensor, code_embeds: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, h: torch.Tensor, sample_fn: SampleFn, img_embeddings: nn.ModuleList,
               lm_img_head: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @classmethod
    def state_shapes(cls, config: LuminaConfig) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def macs_per_row(self) -> ImageHeadMACs:
        raise NotImplementedError


def image_head_class(config: LuminaConfig) -> type[ImageHead]:
    """The class `config.image_head` names (ValueError naming the field for an unknown name or a class that
    is not an `ImageHead`)."""
    cls = IMAGE_HEADS.get(config.image_head, "LuminaConfig.image_head")
    if not issubclass(cls, ImageHead):
        raise ValueError(f"LuminaConfig.image_head={config.image_head!r}: {cls.__qualname__} is not an ImageHead")
    return cls


def build_image_head(config: LuminaConfig) -> ImageHead:
    return image_head_class(config)(config)


__all__ = ["IMAGE_HEADS", "ImageHead", "ImageHeadMACs", "SampleFn", "build_image_head", "image_head_class"]
