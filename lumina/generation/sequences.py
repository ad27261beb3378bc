"""Inference sequences, built only from the training layout's functions, so the samplers see exactly the ids
and metadata training produced. Text (contract 6.2): [prompt (turn 0, clean) | BOA (turn 1, noisy) | finished
answer blocks (clean) | current block (noisy, text mask ids)]. Image (contract 6.3): [prompt | BOA BOI grid
EOI EOA], the grid all image-mask ids; guidance branches drop the prompt's text and/or media as the training
CFG dropout does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from lumina.contract.schema import Media, Part, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.layout_pieces import (
    concat_pieces,
    image_answer_cell_rows,
    layout_image_answer,
    layout_prompt,
    layout_text_answer,
)
from lumina.data.sequence_layout import plan_exchanges


@dataclass
class Prompt:
    """One request: the user turn's parts (text ids and media code grids, in order) and optional system ids.
    `key` seeds this prompt's random stream (set it to a global index so that results do not depend on how
    prompts are batched or sharded); `grid` is the (h, w) cell grid of an image answer."""

    parts: list[Part]
    system: list[int] | None = None
    key: int | str = 0
    grid: tuple[int, int] | None = None

    @property
    def media(self) -> list[Media]:
        return [p for p in self.parts if isinstance(p, Media)]

    @classmethod
    def of_sample(cls, sample: Sample, grid: tuple[int, int] | None = None) -> Prompt:
        """The request of a one-exchange sample: its system ids and user parts (the answer is dropped)."""
        turns = sample.turns
        system = None
        if turns and turns[0].role == "system":
            system = [i for p in turns[0].parts for i in p.ids]
            turns = turns[1:]
        if not turns or turns[0].role != "user":
            raise ValueError(f"sample {sample.id!r}: expected [system,] user, ... turns")
        return cls(list(turns[0].parts), system=system, key=sample.id, grid=grid)


def prompt_piece(prompt: Prompt, tokens: SpecialTokens, parts: list[Part] | None = None) -> TrainingSequence:
    """The prompt turn (turn 0, clean, block -1, positions 0..P-1)."""
    return layout_prompt(prompt.parts if parts is None else parts, tokens, turn=0, start_position=0,
                         system=prompt.system, sample_id=str(prompt.key))


def text_sequence(prompt: TrainingSequence, finished: list[int], block: torch.Tensor, block_index: int,
                  tokens: SpecialTokens, block_length: int) -> tuple[TrainingSequence, torch.Tensor]:
    """prompt piece + BOA + `finished` answer ids (clean, offsets 0..) + `block` [n <= block_length] ids (noisy,
    offsets block_index * block_length ..; a shorter last block). Returns (sequence, rows [n] of the block)."""
    if len(finished) != block_index * block_length:
        raise ValueError(f"{len(finished)} finished answer tokens, expected block_index * block_length = "
                         f"{block_index * block_length}")
    sid = prompt.sample_id
    answer = partial(layout_text_answer, tokens=tokens, turn=1, boa_position=len(prompt),
                     block_length=block_length, sample_id=sid)
    pieces = [prompt, answer(torch.zeros(0, dtype=torch.long))]
    if finished:
        pieces.append(answer(finished, clean=True, with_boa=False))
    pieces.append(answer(block, clean=False, with_boa=False, first_offset=block_index * block_length))
    if len(block) > block_length:
        raise ValueError(f"block of {len(block)} slots, more than block_length={block_length}")
    sequence = concat_pieces(pieces, sid)
    return sequence, torch.arange(len(sequence) - len(block), len(sequence))


def image_sequence(prompt: Prompt, tokens: SpecialTokens, drop_text: bool = False,
                   drop_image: bool = False) -> tuple[TrainingSequence, torch.Tensor]:
    """One guidance branch: the prompt after the training CFG dropout (`plan_exchanges` on a one-exchange
    sample whose answer is an image: drop_text replaces the text with one `<uncondition>`, drop_image removes
    media) + BOA BOI grid EOI EOA with every cell masked. Returns (sequence, cell rows [h * w], row-major)."""
    if prompt.grid is None:
        raise ValueError(f"prompt {prompt.key!r}: an image answer needs grid=(h, w)")
    if len(prompt.grid) != 2 or not all(isinstance(g, int) and g > 0 for g in prompt.grid):
        raise ValueError(f"prompt {prompt.key!r}: grid={prompt.grid!r} must be two positive integers (h, w)")
    h, w = prompt.grid
    placeholder = Media("image", torch.zeros(h * w, tokens.num_codebooks, dtype=torch.long), (h, w))
    turns = [] if prompt.system is None else [Turn("system", [Text(list(prompt.system))])]
    turns += [Turn("user", list(prompt.parts)), Turn("assistant", [placeholder])]
    (exchange,) = plan_exchanges(Sample(str(prompt.key), turns), tokens, drop_text, drop_image)
    head = prompt_piece(prompt, tokens, exchange.prompt_parts)
    answer = layout_image_answer(prompt.grid, tokens, turn=1, start_position=len(head), sample_id=str(prompt.key))
    return concat_pieces([head, answer], str(prompt.key)), len(head) + image_answer_cell_rows(prompt.grid)


# (drop_text, drop_image) of each guidance branch; the conditional branch comes first.
BRANCHES = {
    "none": ((False, False),),
    "single": ((False, False), (True, True)),
    "dual": ((False, False), (True, False), (False, True)),
}
