"""`parallel`: every codebook of an image cell predicted from the backbone state at once (MaskGIT / MAGVIT-style
multi-codebook parallel prediction), no dependency between the codebooks of a cell.

    states[:, c] = LayerNorm(GELU(proj(h)))[c]     proj: H -> C * D, D = H; state c feeds lm_img_head[c]

Sampling draws all C codebooks of a cell in one pass: one `proj` and C head calls, no prefix."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.model.image_heads import IMAGE_HEADS, ImageHead, ImageHeadMACs, SampleFn
from lumina.model.layers import Linear, layer_norm


@IMAGE_HEADS.register("parallel")
class ParallelCodebookHead(ImageHead):
    module_name = "parallel_codebook_head"
    teacher_forced = False

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__(config)
        self.width = config.hidden_size
        self.proj = Linear(config.hidden_size, config.num_codebooks * self.width, bias=True,
                           std=config.initializer_range)
        self.norm = layer_norm(self.width)

    def run(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> states [N, C, D]."""
        return self.norm(F.gelu(self.proj(h)).view(h.shape[0], self.num_codebooks, self.width))

    def forward(self, h: torch.Tensor, code_embeds: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> states [N, C, D]; code_embeds is not read (no teacher forcing)."""
        return self.run(h)

    @torch.no_grad()
    def sample(self, h: torch.Tensor, sample_fn: SampleFn, img_embeddings: nn.ModuleList,
               lm_img_head: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, H] -> (codes int64 [N, C], probabilities [N, C]): codebook c from `lm_img_head[c]` on state c,
        every codebook from the same pass."""
        states = self.run(h)
        picks = [sample_fn(lm_img_head[c](states[:, c]), c) for c in range(self.num_codebooks)]
        return (torch.stack([tokens.long() for tokens, _ in picks], dim=1),
                torch.stack([p for _, p in picks], dim=1))

    @classmethod
    def state_shapes(cls, config: LuminaConfig) -> dict[str, tuple[int, ...]]:
        h, width = config.hidden_size, config.hidden_size
        return {"proj.weight": (config.num_codebooks * width, h), "proj.bias": (config.num_codebooks * width,),
                "norm.weight": (width,), "norm.bias": (width,)}

    def macs_per_row(self) -> ImageHeadMACs:
        return ImageHeadMACs(self.proj.in_features * self.proj.out_features, 0)
