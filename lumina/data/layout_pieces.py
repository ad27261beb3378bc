"""Building blocks of a laid-out sequence: a prompt turn, a text answer, an image answer, media grids.

Training (`lumina.data.sequence_layout`) and the generation samplers both build from these, so they agree on every
id. Every piece is a `TrainingSequence` with labels -100, noise_t 0, answer_mask False.

Conventions (contract 3.1, 6.2, 6.3): token columns are [L, C], text ids fill all C columns. Types: 1 prompt
text and structural specials, 2 prompt media cells and markers, 3 text answer (incl. EOA), 4 image answer
cells and row markers. A prompt turn is clean, block -1.
"""

from __future__ import annotations

import torch

from lumina.contract.roles import IGNORE_INDEX as IGNORE
from lumina.contract.roles import TokenType
from lumina.contract.schema import Media, Part, Text
from lumina.contract.special_tokens import PLACEHOLDER_FIELDS, SpecialTokens
from lumina.contract.training_sequence import TrainingSequence

TYPE_PAD, TYPE_TEXT, TYPE_MEDIA, TYPE_TEXT_ANSWER, TYPE_IMAGE_ANSWER = TokenType


def make_piece(ids: torch.Tensor, type_ids: torch.Tensor, turn: int, positions: torch.Tensor,
               blocks: torch.Tensor, clean: bool, sample_id: str = "") -> TrainingSequence:
    """A piece from ids [L, C], type_ids [L], positions [L], blocks [L]; one turn, one clean flag."""
    n = ids.shape[0]
    return TrainingSequence(
        sample_id=sample_id,
        input_ids=ids.long(),
        labels=torch.full_like(ids, IGNORE, dtype=torch.long),
        type_ids=type_ids.long(),
        turn_ids=torch.full((n,), turn, dtype=torch.long),
        block_ids=blocks.long(),
        position_ids=positions.long(),
        is_clean=torch.full((n,), clean, dtype=torch.bool),
        noise_t=torch.zeros(n, dtype=torch.float32),
        answer_mask=torch.zeros(n, dtype=torch.bool),
    )


def concat_pieces(pieces: list[TrainingSequence], sample_id: str) -> TrainingSequence:
    """Concatenate pieces along the sequence dim."""
    if not pieces:
        raise ValueError(f"sample {sample_id!r}: nothing to concatenate")
    fields = ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
              "noise_t", "answer_mask")
    return TrainingSequence(sample_id=sample_id,
                            **{f: torch.cat([getattr(p, f) for p in pieces]) for f in fields})


def text_ids(ids: list[int] | torch.Tensor, num_codebooks: int) -> torch.Tensor:
    """[n] text ids -> [n, C], the id repeated in every column."""
    t = torch.as_tensor(ids, dtype=torch.long).reshape(-1, 1)
    return t.expand(-1, num_codebooks).clone()


def media_length(kind: str, grid: tuple[int, ...]) -> int:
    """Rows of a prompt media block, incl. its BO*/EO* wrapper."""
    if kind == "image":
        h, w = grid
        return 2 + h * (w + 1)
    if kind in ("video", "mesh3d"):
        g, h, w = grid
        return 2 + g * (h * (w + 1) + 1)
    raise ValueError(f"media kind {kind!r}: expected image, video or mesh3d")


def media_rows(media: Media, tokens: SpecialTokens) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt media block: (ids [L, C], type_ids [L]) with L = media_length(...).

    image  (h, w):    BOI, per row: w cells + 5001, EOI
    video  (t, h, w): BOV, per frame group: per row: w cells + 5004, then 5005; EOV
    mesh3d (z, y, x): BO3d, per layer: per row: x cells + 5002, then 5003; EO3d
    Cells and markers are type 2, the wrapper type 1; marker rows hold the marker in every column.
    """
    c = tokens.num_codebooks
    if media.kind == "image":
        body = _grid_with_row_ends(media.codes, media.grid, tokens.image_row_end)
        open_id, close_id = tokens.boi, tokens.eoi
    elif media.kind in ("video", "mesh3d"):
        row_end, group_end = ((tokens.video_row_end, tokens.video_group_end) if media.kind == "video"
                              else (tokens.mesh3d_row_end, tokens.mesh3d_layer_end))
        g, h, w = media.grid
        groups = _grid_with_row_ends(media.codes, (g * h, w), row_end).reshape(g, h * (w + 1), c)
        group_ends = torch.full((g, 1, c), group_end, dtype=torch.long)
        body = torch.cat([groups, group_ends], dim=1).reshape(-1, c)
        open_id, close_id = ((tokens.bov, tokens.eov) if media.kind == "video"
                             else (tokens.bo3d, tokens.eo3d))
    else:
        raise ValueError(f"media kind {media.kind!r}: expected image, video or mesh3d")
    ids = torch.cat([text_ids([open_id], c), body, text_ids([close_id], c)])
    types = torch.full((ids.shape[0],), TYPE_MEDIA, dtype=torch.long)
    types[0] = types[-1] = TYPE_TEXT
    return ids, types


def user_content(parts: list[Part], tokens: SpecialTokens, where: str = "prompt") -> list[int | Media]:
    """A user turn's content as the official prompt builders lay it out: text ids and media, in order.

    Placeholders in the text (`<IMG_CONTEXT>` etc.) are replaced where they stand by the turn's next Media of
    their kind, and every Media needs one. Without placeholders, media before any text stand on lines of their
    own (M1 "\n" M2 ... Mk, then "\n" text); media after text stand where they are. Raises naming `where` for
    unmatched media or placeholders, or a media line without `SpecialTokens.newline`."""
    media = [p for p in parts if isinstance(p, Media)]
    kinds = {tokens.placeholder(kind): kind for kind in PLACEHOLDER_FIELDS if tokens.placeholder(kind) >= 0}
    if any(i in kinds for p in parts if isinstance(p, Text) for i in p.ids):
        return _expand_placeholders(parts, media, kinds, where)
    out: list[int | Media] = []
    leading = True
    for part in parts:
        if isinstance(part, Text):
            if leading and part.ids and out:
                out.append(_newline(tokens, where))
            leading = leading and not part.ids
            out.extend(part.ids)
        elif leading:
            if out:
                out.append(_newline(tokens, where))
            out.append(part)
        else:
            out.append(part)
    return out


def _expand_placeholders(parts: list[Part], media: list[Media], kinds: dict[int, str],
                         where: str) -> list[int | Media]:
    queues = {kind: [m for m in media if m.kind == kind] for kind in PLACEHOLDER_FIELDS}
    out: list[int | Media] = []
    for part in parts:
        if not isinstance(part, Text):
            continue
        for i in part.ids:
            if i not in kinds:
                out.append(i)
            elif queues[kinds[i]]:
                out.append(queues[kinds[i]].pop(0))
            else:
                raise ValueError(f"{where}: a {kinds[i]} placeholder (id {i}) has no {kinds[i]} media part left "
                                 f"to stand for ({sum(m.kind == kinds[i] for m in media)} given)")
    left = {kind: len(q) for kind, q in queues.items() if q}
    if left:
        raise ValueError(f"{where}: the text holds placeholders but {left} media part(s) have none; give every "
                         "media part a placeholder, or none (then media before the text stand on their own lines)")
    return out


def _newline(tokens: SpecialTokens, where: str) -> int:
    if tokens.newline < 0:
        raise ValueError(f"{where}: a media line ends in '\\n' but SpecialTokens.newline is unset; the tokenizer "
                         "has no single '\\n' token (pass newline=<id>)")
    return tokens.newline


def prompt_length(parts: list[Part], tokens: SpecialTokens, system: list[int] | None = None,
                  where: str = "prompt") -> int:
    """Rows of `layout_prompt(parts, tokens, system=system)`."""
    n = 2 + (0 if system is None else 2 + len(system))
    for item in user_content(parts, tokens, where):
        n += 1 if isinstance(item, int) else media_length(item.kind, tuple(item.grid))
    return n


def layout_prompt(parts: list[Part], tokens: SpecialTokens, turn: int = 0, start_position: int = 0,
                  system: list[int] | None = None, sample_id: str = "") -> TrainingSequence:
    """[`<system>{system}</system>`]`<user>{user_content(parts)}</user>`: one clean turn, block -1, positions
    start_position.., text type 1, media as `media_rows`."""
    c = tokens.num_codebooks
    head = [] if system is None else [tokens.system_open, *system, tokens.system_close]
    chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
    pending = [*head, tokens.user_open]
    for item in user_content(parts, tokens, f"sample {sample_id!r}"):
        if isinstance(item, int):
            pending.append(item)
            continue
        chunks.append(_text_chunk(pending, c))
        pending = []
        chunks.append(media_rows(item, tokens))
    pending.append(tokens.user_close)
    chunks.append(_text_chunk(pending, c))
    ids = torch.cat([ch[0] for ch in chunks])
    types = torch.cat([ch[1] for ch in chunks])
    n = ids.shape[0]
    positions = torch.arange(start_position, start_position + n)
    blocks = torch.full((n,), -1, dtype=torch.long)
    return make_piece(ids, types, turn, positions, blocks, clean=True, sample_id=sample_id)


def layout_text_answer(answer_ids: list[int] | torch.Tensor, tokens: SpecialTokens, turn: int,
                       boa_position: int, block_length: int = 32, clean: bool = False, with_boa: bool = True,
                       first_offset: int = 0, sample_id: str = "") -> TrainingSequence:
    """Rows of a text answer: [BOA] + answer rows (type 3).

    answer_ids [n]: tokens at answer offsets first_offset.. (EOA last when complete; the text mask id for
    undecoded slots). Offset o: position boa_position + 1 + o, block o // block_length. BOA: type 1, block 0,
    noisy, position boa_position.
    """
    if block_length <= 0:
        raise ValueError(f"block_length={block_length}: must be positive")
    c = tokens.num_codebooks
    ids = text_ids(answer_ids, c)
    offsets = torch.arange(first_offset, first_offset + ids.shape[0])
    answer = make_piece(ids, torch.full_like(offsets, TYPE_TEXT_ANSWER), turn, boa_position + 1 + offsets,
                        offsets // block_length, clean=clean, sample_id=sample_id)
    if not with_boa:
        return answer
    boa = make_piece(text_ids([tokens.boa], c), torch.tensor([TYPE_TEXT]), turn, torch.tensor([boa_position]),
                     torch.tensor([0]), clean=False, sample_id=sample_id)
    return concat_pieces([boa, answer], sample_id)


def image_answer_length(grid: tuple[int, int]) -> int:
    """Rows of `layout_image_answer` for an (h, w) grid: BOA BOI h*(w+1) EOI EOA."""
    h, w = grid
    return 4 + h * (w + 1)


def layout_image_answer(grid: tuple[int, int], tokens: SpecialTokens, turn: int, start_position: int,
                        codes: torch.Tensor | None = None, sample_id: str = "") -> TrainingSequence:
    """BOA BOI grid EOI EOA, all noisy, block 0, positions start_position..; the grid is h rows of w cells
    + a 5001 marker (type 4; the specials type 1). codes [h*w, C] fill the cells (None: the image mask id)."""
    h, w = grid
    c = tokens.num_codebooks
    if codes is None:
        codes = torch.full((h * w, c), tokens.image_mask, dtype=torch.long)
    body = _grid_with_row_ends(codes, (h, w), tokens.image_row_end)
    ids = torch.cat([text_ids([tokens.boa, tokens.boi], c), body, text_ids([tokens.eoi, tokens.eoa], c)])
    n = ids.shape[0]
    types = torch.full((n,), TYPE_IMAGE_ANSWER, dtype=torch.long)
    types[:2] = types[-2:] = TYPE_TEXT
    return make_piece(ids, types, turn, torch.arange(start_position, start_position + n),
                      torch.zeros(n, dtype=torch.long), clean=False, sample_id=sample_id)


def image_answer_cell_rows(grid: tuple[int, int]) -> torch.Tensor:
    """[h*w] row indices (within `layout_image_answer`'s piece) of the grid cells, in code order."""
    h, w = grid
    rows = torch.arange(h).unsqueeze(1) * (w + 1) + torch.arange(w).unsqueeze(0)
    return 2 + rows.reshape(-1)


def _grid_with_row_ends(codes: torch.Tensor, grid: tuple[int, int], row_end: int) -> torch.Tensor:
    """codes [h*w, C] -> [h*(w+1), C]: each row of w cells followed by a marker row."""
    h, w = grid
    c = codes.shape[1]
    ends = torch.full((h, 1, c), row_end, dtype=torch.long)
    return torch.cat([codes.long().reshape(h, w, c), ends], dim=1).reshape(-1, c)


def _text_chunk(ids: list[int], num_codebooks: int) -> tuple[torch.Tensor, torch.Tensor]:
    return text_ids(ids, num_codebooks), torch.full((len(ids),), TYPE_TEXT, dtype=torch.long)
