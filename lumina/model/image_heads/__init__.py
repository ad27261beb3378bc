"""Image heads: between the backbone's state at a supervised image row and the C codebook heads (held by the LM).
One `ImageHead` class per head in `IMAGE_HEADS`, chosen by `LuminaConfig.image_head` (official: `channel_ar`)."""

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
    """The contract of an image head (rows independent; D = hidden_size). `forward` (training; code_embeds has 0
    rows and is unread unless teacher_forced) goes through `run`, which activation checkpointing wraps in row
    chunks and `apply_compile` compiles; `sample` may step with a cache of its own instead (no gradients, so
    nothing to checkpoint); `forward` must run on the meta device (training/memory_estimate.py)."""

    module_name: ClassVar[str]  # the LM's attribute holding the head: the prefix of its checkpoint keys
    teacher_forced: ClassVar[bool]  # whether training feeds it the embeddings of the target codes 0..C-2
    # {key under module_name: dtype} of buffers kept in a fixed dtype whatever the model's
    buffer_dtypes: ClassVar[dict[str, torch.dtype]] = {}

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.num_codebooks = config.num_codebooks

    def run(self, *rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, h: torch.Tensor, code_embeds: torch.Tensor) -> torch.Tensor:
        """h [N, H], code_embeds [N, C - 1, H] -> states [N, C, D]; state c feeds lm_img_head[c]."""
        raise NotImplementedError

    def sample(self, h: torch.Tensor, sample_fn: SampleFn, img_embeddings: nn.ModuleList,
               lm_img_head: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, H] -> (codes int64 [N, C], probabilities [N, C])."""
        raise NotImplementedError

    @classmethod
    def state_shapes(cls, config: LuminaConfig) -> dict[str, tuple[int, ...]]:
        """{key under module_name: shape} of every persistent tensor (checkpoint/keys.py)."""
        raise NotImplementedError

    def macs_per_row(self) -> ImageHeadMACs:
        """Multiply-adds per supervised image row (model/flops.py)."""
        raise NotImplementedError


def image_head_class(config: LuminaConfig) -> type[ImageHead]:
    """The `ImageHead` class `config.image_head` names (ValueError naming the field otherwise)."""
    cls = IMAGE_HEADS.get(config.image_head, "LuminaConfig.image_head")
    if not issubclass(cls, ImageHead):
        raise ValueError(f"LuminaConfig.image_head={config.image_head!r}: {cls.__qualname__} is not an ImageHead")
    return cls


def build_image_head(config: LuminaConfig) -> ImageHead:
    return image_head_class(config)(config)


__all__ = ["IMAGE_HEADS", "ImageHead", "ImageHeadMACs", "SampleFn", "build_image_head", "image_head_class"]
