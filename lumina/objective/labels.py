"""Label normalisation and target gathering at the model output's supervised rows.

Row semantics (official contract 5.2/5.3): a type-3 row is supervised when its column-0 label is not -100
(text target = column 0, no shift; labels in other columns with column 0 = -100 are an error); a type-4
row is supervised when any of its C labels is not -100, and then all C must be image codes in
[0, codebook_size). Labels on rows of any other type are errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lumina.data.batch import as_int64
from lumina.data.roles import IGNORE_INDEX, TokenType


def normalize_labels(labels: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """labels [S, C] | [B, S, C] | [B, S, 1] | legacy [B, S]  ->  [B, S, C] int64.

    B, S, C come from `input_ids` [B, S, C]; a 2-D label is resolved against [B, S] (never guessed from its
    last dim). A one-column label (legacy text-only) fills column 0; the other columns become -100.
    """
    if input_ids.dim() != 3:
        raise ValueError(f"input_ids must have shape [B, S, C], got {list(input_ids.shape)}")
    batch, seq_len, num_cols = input_ids.shape
    labels = as_int64("labels", labels)
    if labels.dim() == 2:
        if labels.shape == (batch, seq_len):
            labels = labels.unsqueeze(-1)
        elif batch == 1 and labels.shape[0] == seq_len:
            labels = labels.unsqueeze(0)
        else:
            raise ValueError(f"labels has shape {list(labels.shape)}; a 2-D label must be [B, S]=[{batch}, "
                             f"{seq_len}] or (B=1) [S, C]=[{seq_len}, {num_cols}]")
    if labels.dim() != 3 or labels.shape[:2] != (batch, seq_len):
        raise ValueError(f"labels has shape {list(labels.shape)}; expected [B, S, C]=[{batch}, {seq_len}, "
                         f"{num_cols}], [S, C] or [B, S]")
    if labels.shape[2] == num_cols:
        return labels
    if labels.shape[2] != 1:
        raise ValueError(f"labels has {labels.shape[2]} columns; input_ids has C={num_cols} (or pass 1 column)")
    full = labels.new_full((batch, seq_len, num_cols), IGNORE_INDEX)
    full[..., 0] = labels[..., 0]
    return full


@dataclass
class Targets:
    """text [Nt] int64 (targets at the output's text rows), image [Ni, C] int64 (at its image rows)."""

    text: torch.Tensor
    image: torch.Tensor


def gather_targets(labels: torch.Tensor, text_rows: torch.Tensor, image_rows: torch.Tensor) -> Targets:
    """labels [B, S, C] normalised; rows are flat indices b*S+s chosen by the model (never re-selected)."""
    flat = labels.reshape(-1, labels.shape[-1])
    return Targets(text=flat[text_rows.long(), 0], image=flat[image_rows.long()])


def validate_supervision(
    labels: torch.Tensor,
    type_ids: torch.Tensor,
    token_valid: torch.Tensor,
    text_rows: torch.Tensor,
    image_rows: torch.Tensor,
    vocab_size: int,
    codebook_size: int,
    noise_t: torch.Tensor | None = None,
    answer_mask: torch.Tensor | None = None,
) -> None:
    """Raise ValueError naming the first bad row/field. labels [B, S, C]; type_ids, token_valid [B, S];
    rows [Nt] / [Ni] flat. With `noise_t`/`answer_mask` given (inverse_t weighting), every supervised text
    row must have t > 0 and lie in the answer mask. Costs one host sync when everything is fine."""
    num_cols = labels.shape[-1]
    flat = labels.reshape(-1, num_cols)
    types = type_ids.reshape(-1)
    valid = token_valid.reshape(-1)
    labelled = (flat != IGNORE_INDEX).any(-1)
    text_sup = (types == TokenType.TEXT_ANSWER) & (flat[:, 0] != IGNORE_INDEX)
    image_sup = (types == TokenType.IMAGE_ANSWER) & labelled
    text_rows, image_rows = text_rows.long(), image_rows.long()
    checks: dict[str, torch.Tensor] = {
        "other_type": labelled & (types != TokenType.TEXT_ANSWER) & (types != TokenType.IMAGE_ANSWER),
        "text_column": labelled & (types == TokenType.TEXT_ANSWER) & (flat[:, 0] == IGNORE_INDEX),
        "invalid_token": (text_sup | image_sup) & ~valid,
        "text_range": text_sup & ((flat[:, 0] < 0) | (flat[:, 0] >= vocab_size)),
        "image_range": image_sup & ((flat < 0) | (flat >= codebook_size)).any(-1),
    }
    if noise_t is not None:
        checks["noise_t"] = text_sup & ~(noise_t.reshape(-1) > 0)
    if answer_mask is not None:
        checks["answer_mask"] = text_sup & ~answer_mask.reshape(-1)
    flags = [mask.any() for mask in checks.values()]
    flags.append(text_sup.sum() != text_rows.numel())
    flags.append(image_sup.sum() != image_rows.numel())
    flags.append(~text_sup[text_rows].all())
    flags.append(~image_sup[image_rows].all())
    bad = torch.stack(flags).tolist()  # the one host sync
    if not any(bad):
        return
    for (name, mask), failed in zip(checks.items(), bad, strict=False):
        if failed:
            row = int(mask.nonzero()[0, 0])
            raise ValueError(_describe(name, row, flat[row].tolist(), int(types[row]), vocab_size, codebook_size,
                                       labels.shape[1]))
    raise ValueError(
        f"the model output's rows disagree with the labels: text_rows has {text_rows.numel()} rows, labels "
        f"supervise {int(text_sup.sum())} type-3 rows; image_rows has {image_rows.numel()} rows, labels "
        f"supervise {int(image_sup.sum())} type-4 rows")


def _describe(check: str, row: int, row_labels: list[int], row_type: int, vocab_size: int, codebook_size: int,
              seq_len: int) -> str:
    where = f"labels row {row} (b={row // seq_len}, s={row % seq_len}, type {row_type}) = {row_labels}"
    if check == "other_type":
        return f"{where}: only type-3 (text answer) and type-4 (image answer) rows may carry labels other than -100"
    if check == "text_column":
        return (f"{where}: a type-3 (text answer) row's target is column 0, which is -100 while other columns "
                f"are labelled (the label would be dropped)")
    if check == "invalid_token":
        return f"{where}: supervised row has token_valid false"
    if check == "text_range":
        return f"{where}: text target (column 0) must lie in [0, vocab_size={vocab_size}) or be -100"
    if check == "image_range":
        return (f"{where}: a supervised image row needs all codebook labels in [0, codebook_size={codebook_size}) "
                f"(valid image labels must be non-negative, all C of them; legacy one-column labels cannot "
                f"supervise images)")
    if check == "noise_t":
        return f"{where}: inverse_t weighting needs noise_t > 0 at every supervised text row"
    return f"{where}: inverse_t weighting needs answer_mask true at every supervised text row"
