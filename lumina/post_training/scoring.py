"""`score_views`: the weighted log-probability sums an estimator's views stand for, through the training
forward (`model(batch)` with labels at the scored rows: the text head's logits, the image head teacher-forced on
the drawn codes), so a sharding strategy's hooks see an ordinary step. Each view is laid out with the samplers'
own sequence builders, so a scored state is the one the sampler saw.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lumina.contract.batch import PackedBatch
from lumina.contract.roles import IGNORE_INDEX
from lumina.contract.schema import Text
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.packing import collate_pack
from lumina.generation.sequences import Prompt, image_sequence, prompt_piece, text_sequence
from lumina.generation.sync import max_over_ranks
from lumina.model.output import LuminaOutput
from lumina.post_training.estimators import View
from lumina.post_training.samples import Completion


def view_sequence(completion: Completion, view: View, tokens: SpecialTokens) -> TrainingSequence:
    """The view as one sequence: masked slots / cells hold the mask id, labels only at the scored ones."""
    if view.scored.shape != view.masked.shape or bool((view.scored & ~view.masked).any()):
        raise ValueError(f"view of completion {view.sample}: scored must be a subset of masked, of one shape")
    if completion.is_image:
        seq, rows = image_sequence(completion.prompt.prompt, tokens)
        codes = completion.codes.to(seq.input_ids.dtype)
        if view.masked.shape[0] != codes.shape[0]:
            raise ValueError(f"view of completion {view.sample}: {view.masked.shape[0]} cells, the grid has "
                             f"{codes.shape[0]}")
        seq.input_ids[rows[~view.masked]] = codes[~view.masked]
        seq.labels = torch.full_like(seq.labels, IGNORE_INDEX)
        seq.labels[rows[view.scored]] = codes[view.scored]
        return seq
    start, stop = completion.blocks()[view.block]
    block = torch.tensor(completion.ids[start:stop], dtype=torch.long)
    if view.masked.shape[0] != block.shape[0]:
        raise ValueError(f"view of completion {view.sample}: {view.masked.shape[0]} slots, block {view.block} "
                         f"has {block.shape[0]}")
    shown = torch.where(view.masked, tokens.text_mask, block)
    piece = prompt_piece(completion.prompt.prompt, tokens)
    seq, rows = text_sequence(piece, completion.ids[:start], shown, view.block, tokens, completion.block_length)
    seq.labels = torch.full_like(seq.labels, IGNORE_INDEX)
    seq.labels[rows[view.scored], 0] = block[view.scored]
    return seq


def score_views(model: nn.Module, completions: list[Completion], views: list[View], tokens: SpecialTokens,
                temperature: float = 1.0, pack_tokens: int = 8192,
                on_output: Callable[[LuminaOutput, PackedBatch], None] | None = None) -> torch.Tensor:
    """-> float32 [len(completions)]: per completion sum over its views of weight * sum of the scored
    log-probabilities under softmax(logits / temperature) (an image cell's: the sum over its C codebooks).
    Views are packed up to `pack_tokens` rows per forward (a longer view gets a pack of its own).
    Differentiable w.r.t. the model's parameters unless called under no_grad. `on_output(output, batch)` sees
    every forward (the training module's expert-load bookkeeping)."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: log-probabilities need a sampling temperature > 0")
    device = next(model.parameters()).device
    total = torch.zeros(len(completions), dtype=torch.float32, device=device)
    packs: list[list[tuple[View | None, TrainingSequence]]] = [[]]
    used = 0
    for view in views:
        seq = view_sequence(completions[view.sample], view, tokens)
        if packs[-1] and used + len(seq) > pack_tokens:
            packs.append([])
            used = 0
        packs[-1].append((view, seq))
        used += len(seq)
    packs = [p for p in packs if p]
    # under expert parallelism every rank must run the same forwards: a rank with fewer packs scores a dummy one;
    # with no view at all one dummy forward still runs, so the estimates join the step's graph
    for index in range(max(1, max_over_ranks(len(packs), device))):
        pack = packs[index] if index < len(packs) else [(None, _dummy_sequence(tokens))]
        total = total + _score_pack(model, pack, len(completions), tokens, temperature, device, on_output)
    return total


def _dummy_sequence(tokens: SpecialTokens) -> TrainingSequence:
    """An empty prompt and one masked answer slot labelled 0: a forward whose score counts with weight 0."""
    piece = prompt_piece(Prompt([Text([])], key="dummy"), tokens)
    seq, rows = text_sequence(piece, [], torch.tensor([tokens.text_mask]), 0, tokens, 1)
    seq.labels = torch.full_like(seq.labels, IGNORE_INDEX)
    seq.labels[rows, 0] = 0
    return seq


def _score_pack(model: nn.Module, pack: list[tuple[View, TrainingSequence]], num: int, tokens: SpecialTokens,
                temperature: float, device: torch.device, on_output: Callable | None) -> torch.Tensor:
    sequences = [seq for _, seq in pack]
    length = sum(len(s) for s in sequences)
    batch = collate_pack(sequences, length, tokens.pad, tokens.num_codebooks).to(device)
    # per flat row: the completion it scores and its weight
    owner = torch.full((length,), -1, dtype=torch.long)
    weight = torch.zeros(length, dtype=torch.float32)
    offset = 0
    for view, seq in pack:
        labelled = (seq.labels != IGNORE_INDEX).any(-1).nonzero().squeeze(1) + offset
        if view is not None:  # a dummy row keeps owner 0 and weight 0
            owner[labelled], weight[labelled] = view.sample, view.weight
        offset += len(seq)
    owner = owner.clamp(min=0)
    owner, weight = owner.to(device), weight.to(device)
    out = model(batch)
    if on_output is not None:
        on_output(out, batch)
    labels = batch.labels.reshape(length, -1)
    heads = out.heads
    total = torch.zeros(num, dtype=torch.float32, device=device)
    # both heads always run (on possibly empty rows), so every rank's backward reaches the same modules
    logp = torch.log_softmax(heads.text_logits(out.text_states).float() / temperature, dim=-1)
    picked = logp.gather(1, labels[out.text_rows, :1]).squeeze(1)
    total = total.index_add(0, owner[out.text_rows], picked * weight[out.text_rows])
    logp = torch.log_softmax(heads.image_logits(out.image_states).float() / temperature, dim=-1)
    picked = logp.gather(2, labels[out.image_rows].unsqueeze(-1)).squeeze(-1).sum(1)  # over the C codebooks
    return total.index_add(0, owner[out.image_rows], picked * weight[out.image_rows])
