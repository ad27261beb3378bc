"""Hand-built model outputs and packs for the objective's unit tests."""

from __future__ import annotations

import torch
from torch import nn

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaOutput
from lumina.model.heads import Head, LuminaHeads


def _head(logits: torch.Tensor) -> Head:
    """A head whose logits at identity states [N, N] are `logits` [N, V] (its weight is logits^T)."""
    num_rows, num_classes = logits.shape
    head = Head(num_rows, num_classes, std=0.02).to(logits.dtype)
    head.weight = nn.Parameter(logits.detach().t().contiguous(), requires_grad=logits.requires_grad)
    return head


def HandOutput(text_logits: torch.Tensor, image_logits: torch.Tensor,  # noqa: N802 - reads like a dataclass
               **fields: object) -> LuminaOutput:
    """A LuminaOutput whose heads give exactly `text_logits` [Nt, V] and `image_logits` [Ni, C, K] (identity
    states, heads holding the logits as weights; no hidden states)."""
    num_cells, num_codebooks, _ = image_logits.shape
    eye_text = torch.eye(text_logits.shape[0], dtype=text_logits.dtype)
    eye_image = torch.eye(num_cells, dtype=image_logits.dtype).unsqueeze(1).expand(-1, num_codebooks, -1)
    heads = LuminaHeads(_head(text_logits), nn.ModuleList(_head(image_logits[:, c]) for c in range(num_codebooks)))
    return LuminaOutput(hidden=torch.empty(0), text_states=eye_text, image_states=eye_image, heads=heads, **fields)


def logit_grads(output: LuminaOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of a HandOutput's logits: (text [Nt, V], image [Ni, C, K]) from its heads' weights."""
    heads = output.heads
    return heads.text.weight.grad.t(), torch.stack([head.weight.grad.t() for head in heads.image], dim=1)


def make_batch(type_ids: list[int], labels: torch.Tensor, num_cols: int = 2, token_valid: list[bool] | None = None,
               noise_t: list[float] | None = None, answer_mask: list[bool] | None = None) -> PackedBatch:
    """A one-segment pack of length S = len(type_ids) whose metadata the objective does not read."""
    seq_len = len(type_ids)
    return PackedBatch(
        input_ids=torch.zeros(1, seq_len, num_cols, dtype=torch.long),
        type_ids=torch.tensor([type_ids]),
        turn_ids=torch.zeros(1, seq_len, dtype=torch.long),
        block_ids=torch.zeros(1, seq_len, dtype=torch.long),
        position_ids=torch.arange(seq_len).unsqueeze(0),
        is_clean=torch.zeros(1, seq_len, dtype=torch.bool),
        token_valid=torch.tensor([token_valid if token_valid is not None else [True] * seq_len]),
        cu_seqlens=torch.tensor([0, seq_len], dtype=torch.int32),
        labels=labels,
        noise_t=None if noise_t is None else torch.tensor([noise_t]),
        answer_mask=None if answer_mask is None else torch.tensor([answer_mask]),
    )
