"""One sample -> one block-diffusion training sequence.

Layout of a sample with exchanges (prompt_k, answer_k), k = 0..K-1:

    [prompt_0 | answer_0 | prompt_1 | answer_1 | ... | memory of text answers, in turn order]

- prompt_k (turn 2k): `layout_pieces.layout_prompt` (the system turn with k = 0 only), clean, block -1.
- text answer_k (turn 2k+1): BOA + answer tokens + EOA, noisy (each token masked with the schedule's p(t)),
  labels = original ids at masked rows. Its "answer memory" repeats the answer rows (no BOA) clean with the
  same ids and labels -100: noisy block b sees the clean blocks < b (rule R3), later turns the whole answer.
- image answer_k (the last turn): BOA BOI grid EOI EOA, noisy, block 0; `noise.image_mask_count` cells are
  masked (all C columns), labels = their codes. No memory.
- Positions run 0.. over prompts and answers; memory rows reuse their noisy copy's positions.
- CFG dropout (image-answer samples only), as the official guidance branches (infer_t2i_sft.py): drop_text
  and drop_image -> `<uncondition>` alone; drop_text -> the media, each on its own line, then `<uncondition>`;
  drop_image -> the text without placeholders or media, "\n" stripped at both ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lumina.contract.schema import GRID_RANK, Media, Part, Sample, Text
from lumina.contract.special_tokens import PLACEHOLDER_FIELDS, UNSET, SpecialTokens
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.layout_pieces import (
    concat_pieces,
    image_answer_cell_rows,
    image_answer_length,
    layout_image_answer,
    layout_prompt,
    layout_text_answer,
    prompt_length,
    user_content,
)
from lumina.data.noise import (
    NoiseConfig,
    cfg_dropout,
    image_answer_noise,
    sample_generator,
    text_answer_noise,
)


@dataclass
class Exchange:
    """One prompt turn and its answer (ids without EOA, or the image), after validation and CFG dropout."""

    prompt_parts: list[Part]
    system: list[int] | None
    answer_text: list[int] | None
    answer_image: Media | None


def plan_exchanges(sample: Sample, tokens: SpecialTokens, drop_text: bool = False,
                   drop_image: bool = False, check_values: bool = True) -> list[Exchange]:
    """Validate `sample`'s turns and split them into exchanges, applying CFG dropout; ValueError names the
    sample and field. Turns: [system (text)], user, assistant, ..., ending with an assistant turn, which is
    text only or exactly one image (then the last turn). `check_values`: also check ids and codes.
    """
    sid = sample.id
    turns = sample.turns
    system = None
    start = 0
    if turns and turns[0].role == "system":
        system = _text_of(sample, 0, tokens, check_values, what="system turn")
        start = 1
    body = turns[start:]
    if not body:
        raise ValueError(f"sample {sid!r}: turns has no user/assistant exchange")
    for k, turn in enumerate(body, start=start):
        expected = "user" if (k - start) % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(f"sample {sid!r}: turns[{k}].role={turn.role!r}, expected {expected!r} "
                             f"(an optional system turn first, then user/assistant alternating)")
    if len(body) % 2:
        raise ValueError(f"sample {sid!r}: turns[{len(turns) - 1}] is a user turn with no assistant answer")

    exchanges = []
    for k in range(start, len(turns), 2):
        prompt_parts = list(turns[k].parts)
        for j, part in enumerate(prompt_parts):
            _check_part(sample, k, j, part, tokens, check_values)
        if check_values:
            user_content(prompt_parts, tokens, f"sample {sid!r}: turns[{k}]")  # placeholders match the media
        answer_text, answer_image = _answer_of(sample, k + 1, tokens, check_values)
        if answer_image is not None and k + 2 < len(turns):
            raise ValueError(f"sample {sid!r}: turns[{k + 1}] is an image answer but more turns follow; "
                             f"an image answer has no clean copy, so it must be the last turn")
        exchanges.append(Exchange(prompt_parts, system if k == start else None, answer_text, answer_image))
    last = exchanges[-1]
    if last.answer_image is not None:
        last.prompt_parts = _cfg_drop(last.prompt_parts, tokens, drop_text, drop_image)
    return exchanges


def check_sample(sample: Sample, tokens: SpecialTokens) -> None:
    """Every check `layout_sample` makes on `sample` (structure, text ids, media codes), building nothing."""
    plan_exchanges(sample, tokens)


def laid_out_length(sample: Sample, tokens: SpecialTokens, drop_text: bool = False,
                    drop_image: bool = False) -> int:
    """len(layout) for the given CFG decisions (from `cfg_dropout`), without building tensors."""
    n = 0
    for ex in plan_exchanges(sample, tokens, drop_text, drop_image, check_values=False):
        n += prompt_length(ex.prompt_parts, tokens, ex.system, f"sample {sample.id!r}")
        if ex.answer_text is not None:
            n += 1 + 2 * (len(ex.answer_text) + 1)  # BOA + noisy rows + memory rows (answer + EOA each)
        else:
            n += image_answer_length(tuple(ex.answer_image.grid))
    return n


def layout_sample(sample: Sample, tokens: SpecialTokens, noise_cfg: NoiseConfig, seed: int,
                  epoch: int) -> TrainingSequence:
    """The training sequence of `sample` for `epoch`: seeded CFG dropout and noise (reproducible)."""
    drop_text, drop_image = cfg_dropout(seed, epoch, sample.id, noise_cfg)
    exchanges = plan_exchanges(sample, tokens, drop_text, drop_image)
    gen = sample_generator(seed, epoch, sample.id, "noise")
    return _assemble(sample.id, exchanges, tokens, noise_cfg, gen, fixed_t=None)


def layout_eval(sample: Sample, tokens: SpecialTokens, noise_cfg: NoiseConfig, seed: int,
                t: float) -> TrainingSequence:
    """A validation sequence at noise level t (text p(t), ceil(t * cells) image cells), no CFG dropout,
    masked positions seeded by (seed, sample)."""
    exchanges = plan_exchanges(sample, tokens)
    gen = sample_generator(seed, 0, sample.id, "eval")
    return _assemble(sample.id, exchanges, tokens, noise_cfg, gen, fixed_t=t)


def _assemble(sid: str, exchanges: list[Exchange], tokens: SpecialTokens, cfg: NoiseConfig,
              gen: torch.Generator, fixed_t: float | None) -> TrainingSequence:
    text_lengths = [len(ex.answer_text) + 1 for ex in exchanges if ex.answer_text is not None]
    text_noise = iter(text_answer_noise(text_lengths, cfg, gen, fixed_t) if text_lengths else [])
    pieces, memory = [], []
    position = 0
    for k, ex in enumerate(exchanges):
        prompt = layout_prompt(ex.prompt_parts, tokens, turn=2 * k, start_position=position, system=ex.system,
                               sample_id=sid)
        pieces.append(prompt)
        position += len(prompt)
        if ex.answer_text is not None:
            ids = torch.tensor([*ex.answer_text, tokens.eoa], dtype=torch.long)
            masked, t = next(text_noise)
            answer = layout_text_answer(ids, tokens, turn=2 * k + 1, boa_position=position,
                                        block_length=cfg.block_length, sample_id=sid)
            rows = torch.arange(1, len(answer))  # answer rows follow BOA
            _noise_rows(answer, rows, masked, t, tokens.text_mask)
            memory.append(layout_text_answer(ids, tokens, turn=2 * k + 1, boa_position=position,
                                             block_length=cfg.block_length, clean=True, with_boa=False,
                                             sample_id=sid))
        else:
            grid = tuple(ex.answer_image.grid)
            answer = layout_image_answer(grid, tokens, turn=2 * k + 1, start_position=position,
                                         codes=ex.answer_image.codes, sample_id=sid)
            rows = image_answer_cell_rows(grid)
            masked = image_answer_noise(len(rows), cfg, gen, fixed_t)
            fraction = torch.full((len(rows),), masked.sum().item() / len(rows), dtype=torch.float32)
            _noise_rows(answer, rows, masked, fraction, tokens.image_mask)
        pieces.append(answer)
        position += len(answer)
    return concat_pieces(pieces + memory, sid)


def _noise_rows(piece: TrainingSequence, rows: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                mask_id: int) -> None:
    """In place: `rows` get noise_t = t and answer_mask; the masked ones get mask_id, labels their ids."""
    hit = rows[masked]
    piece.labels[hit] = piece.input_ids[hit]
    piece.input_ids[hit] = mask_id
    piece.noise_t[rows] = t
    piece.answer_mask[rows] = True


def _cfg_drop(parts: list[Part], tokens: SpecialTokens, drop_text: bool, drop_image: bool) -> list[Part]:
    """The user turn of a CFG-dropout branch (module docstring)."""
    media = [p for p in parts if isinstance(p, Media)]
    if drop_text:
        return ([] if drop_image else list(media)) + [Text([tokens.uncondition])]
    if not drop_image or not media:
        return parts
    placeholders = {tokens.placeholder(kind) for kind in PLACEHOLDER_FIELDS} - {UNSET}
    ids = [i for p in parts if isinstance(p, Text) for i in p.ids if i not in placeholders]
    while ids and ids[0] == tokens.newline:
        ids.pop(0)
    while ids and ids[-1] == tokens.newline:
        ids.pop()
    return [Text(ids)]


def _text_of(sample: Sample, k: int, tokens: SpecialTokens, check_values: bool, what: str) -> list[int]:
    ids: list[int] = []
    for j, part in enumerate(sample.turns[k].parts):
        if not isinstance(part, Text):
            raise ValueError(f"sample {sample.id!r}: turns[{k}].parts[{j}] is {type(part).__name__}; "
                             f"a {what} holds text only")
        _check_part(sample, k, j, part, tokens, check_values)
        ids.extend(part.ids)
    return ids


def _answer_of(sample: Sample, k: int, tokens: SpecialTokens,
               check_values: bool) -> tuple[list[int] | None, Media | None]:
    parts = sample.turns[k].parts
    where = f"sample {sample.id!r}: turns[{k}]"
    media = [p for p in parts if isinstance(p, Media)]
    if media:
        if len(parts) != 1:
            raise ValueError(f"{where}.parts has {len(parts)} parts incl. media; an assistant turn is text "
                             f"only or exactly one image")
        image = media[0]
        if image.kind != "image":
            raise ValueError(f"{where}.parts[0].kind={image.kind!r}: only images can be generated")
        _check_part(sample, k, 0, image, tokens, check_values)
        return None, image
    ids = _text_of(sample, k, tokens, check_values, what="text answer")
    if not ids:
        raise ValueError(f"{where}.parts: the assistant answer is empty")
    return ids, None


def _check_part(sample: Sample, k: int, j: int, part: Part, tokens: SpecialTokens,
                check_values: bool) -> None:
    where = f"sample {sample.id!r}: turns[{k}].parts[{j}]"
    if isinstance(part, Text):
        if not check_values:
            return
        ids = torch.as_tensor(part.ids, dtype=torch.long)
        bad = (ids < 0) | (ids >= tokens.text_vocab_size)
        if bad.any():
            raise ValueError(f"{where}.ids has values outside [0, {tokens.text_vocab_size}), "
                             f"e.g. {ids[bad][:4].tolist()}")
        reserved = torch.isin(ids, torch.tensor(sorted(tokens.structural_text_ids)))
        if reserved.any():
            raise ValueError(f"{where}.ids contains ids the layout reserves (pad, mask, BOA/EOA, media "
                             f"wrappers), e.g. {ids[reserved][:4].tolist()}")
    elif isinstance(part, Media):
        if check_values:
            part.validate(tokens.codebook_size, tokens.num_codebooks, where=where)
        elif (part.kind not in GRID_RANK or len(part.grid) != GRID_RANK[part.kind]
              or any(int(g) <= 0 for g in part.grid)):
            raise ValueError(f"{where}: kind={part.kind!r} grid={part.grid} is not a valid media grid")
    else:
        raise ValueError(f"{where} is {type(part).__name__}; expected Text or Media")
