"""`allowed_mask` on hand-built packs: specific pairs from the contract's rule table (section 4.3)."""

from __future__ import annotations

import pytest
import torch
from attn_helpers import C, N, pack, random_pack

from lumina.attention import allowed_mask


def mask_of(batch, rules: bool = True) -> torch.Tensor:
    if not rules:
        return allowed_mask(batch.token_valid, batch.cu_seqlens)[0]
    return allowed_mask(batch.token_valid, batch.cu_seqlens, batch.type_ids, batch.turn_ids, batch.is_clean,
                        batch.block_ids)[0]


def check(mask: torch.Tensor, allowed: list[tuple[int, int]], blocked: list[tuple[int, int]]) -> None:
    for q, k in allowed:
        assert mask[q, k], f"query {q} should attend key {k}"
    for q, k in blocked:
        assert not mask[q, k], f"query {q} must not attend key {k}"


def test_two_samples_are_block_diagonal():
    batch = pack([(1, 0, -1, C)] * 5, cu=[0, 3, 5], seq_len=6)
    mask = mask_of(batch, rules=False)
    check(mask, allowed=[(0, 2), (2, 0), (1, 1), (3, 4), (4, 3)],
          blocked=[(0, 3), (3, 0), (2, 4), (4, 2), (5, 5), (4, 5), (5, 0)])
    assert mask.shape == (6, 6)
    assert int(mask.sum()) == 3 * 3 + 2 * 2


def test_multi_turn_text_with_blocks():
    rows = [
        (1, 0, -1, C), (1, 0, -1, C),  # 0-1 user prompt, turn 0
        (3, 1, 0, N), (3, 1, 0, N),  # 2-3 answer block 0, noisy
        (3, 1, 1, N), (3, 1, 1, N),  # 4-5 answer block 1, noisy
        (3, 1, 0, C), (3, 1, 0, C),  # 6-7 answer memory block 0
        (3, 1, 1, C), (3, 1, 1, C),  # 8-9 answer memory block 1
        (1, 2, -1, C),  # 10 user, turn 2
        (3, 3, 0, N),  # 11 answer turn 3, noisy
    ]
    mask = mask_of(pack(rows, cu=[0, 12]))
    check(mask,
          allowed=[(4, 5), (2, 3), (4, 6), (2, 0), (8, 6), (6, 0), (10, 8), (11, 10), (11, 8), (0, 1), (1, 0),
                   (6, 7), (7, 6)],
          blocked=[(4, 2),  # R1: noisy text sees same-turn noisy text of its own block only
                   (4, 8),  # R3: clean earlier blocks only (1 < 1 fails)
                   (2, 6),  # R3: 0 < 0 fails
                   (6, 8),  # R7: clean text sees blocks <= its own
                   (6, 2), (10, 4), (0, 2),  # clean never sees noisy
                   (0, 10), (0, 6),  # later turns are invisible to clean queries
                   (11, 4)])  # noisy turn 3 cannot see noisy turn 1


def test_multi_turn_block_prompt_key_rule():
    # R1 second branch: noisy text sees same-turn noisy type-1 keys of blocks <= its own (BOA is block 0)
    rows = [(1, 0, -1, C), (1, 1, 0, N), (3, 1, 0, N), (3, 1, 1, N), (1, 1, 1, N)]
    mask = mask_of(pack(rows, cu=[0, 5]))
    check(mask, allowed=[(2, 1), (3, 1), (3, 4), (1, 0)],
          blocked=[(2, 4),  # type-1 key of a later block
                   (1, 2), (1, 3)])  # R6: noisy other never sees same-turn noisy text


def test_text_to_image_noisy_image_turn_is_bidirectional():
    rows = [
        (1, 0, 0, C), (1, 0, 0, C),  # 0-1 prompt, clean
        (1, 1, 0, N), (1, 1, 0, N),  # 2 BOA, 3 BOI
        (4, 1, 0, N), (4, 1, 0, N), (4, 1, 0, N),  # 4-5 grid cells, 6 row marker
        (1, 1, 0, N), (1, 1, 0, N),  # 7 EOI, 8 EOA
    ]
    mask = mask_of(pack(rows, cu=[0, 9]))
    turn1 = list(range(2, 9))
    check(mask, allowed=[(q, k) for q in turn1 for k in turn1] + [(4, 0), (8, 1), (0, 1), (1, 0)],
          blocked=[(0, k) for k in turn1] + [(1, 4)])


def test_editing_with_input_image():
    rows = [
        (1, 0, 0, C),  # 0 system text
        (2, 0, 0, C), (2, 0, 0, C), (2, 0, 0, C),  # 1-3 source image (media prompt)
        (1, 0, 0, C),  # 4 instruction
        (1, 1, 0, N),  # 5 BOA
        (4, 1, 0, N), (4, 1, 0, N),  # 6-7 image answer
        (1, 1, 0, N),  # 8 EOA
        (3, 1, 0, N),  # 9 a noisy text answer in the same turn
    ]
    mask = mask_of(pack(rows, cu=[0, 10]))
    check(mask,
          allowed=[(6, 2),  # R5 noisy image -> clean previous turn
                   (2, 4), (4, 2), (1, 3),  # R8 clean media/text of the same turn
                   (5, 7),  # R6 noisy other -> noisy image
                   (6, 9),  # R4 noisy image sees every same-turn noisy key
                   (9, 5),  # R1 noisy text -> same-turn noisy type 1 of block <= its own
                   (9, 2)],  # R2
          blocked=[(2, 6), (4, 5),  # clean never sees noisy
                   (9, 6), (9, 7),  # noisy text never sees same-turn noisy image keys
                   (5, 9), (8, 9)])  # R6 excludes noisy text keys


def test_tail_padding_and_invalid_tokens_attend_nothing():
    batch = pack([(1, 0, 0, C)] * 4, cu=[0, 4], seq_len=6, invalid=(1,))
    mask = mask_of(batch)
    assert not mask[4:].any() and not mask[:, 4:].any()
    assert not mask[1].any() and not mask[:, 1].any()
    check(mask, allowed=[(0, 2), (3, 0), (2, 2)], blocked=[(0, 1), (1, 0), (1, 1), (4, 4)])


def test_single_segment_simple_rules():
    rows = [(1, 0, -1, C), (1, 0, -1, C), (3, 1, -1, N), (3, 1, -1, N), (3, 1, -1, C), (3, 1, -1, C)]
    mask = mask_of(pack(rows, cu=[0, 6]))
    check(mask, allowed=[(2, 0), (2, 3), (4, 0), (4, 5), (5, 4), (1, 0)],  # S2, S1, S3
          blocked=[(2, 4),  # noisy -> clean needs an earlier turn
                   (4, 2),  # clean -> noisy
                   (0, 4)])  # clean -> clean of a later turn
    # all block ids -1: the simple rules, under which noisy text sees same-turn noisy text of any block
    rows = [(3, 0, -1, N), (3, 0, -1, N)]
    assert mask_of(pack(rows, cu=[0, 2])).all()


def test_missing_turn_or_clean_is_zeros():
    batch = pack([(1, 0, -1, C), (1, 1, -1, N)], cu=[0, 2])
    only_turns = allowed_mask(batch.token_valid, batch.cu_seqlens, turn_ids=batch.turn_ids)[0]
    # is_clean all 0 (noisy): S1 needs the same turn
    assert only_turns.tolist() == [[True, False], [False, True]]
    only_clean = allowed_mask(batch.token_valid, batch.cu_seqlens, is_clean=torch.tensor([1, 0]))[0]
    # turns all 0: the clean token sees only clean keys, the noisy one sees noisy of the same turn
    assert only_clean.tolist() == [[True, False], [False, True]]


def test_integer_flags_accepted_and_checked():
    valid = torch.tensor([1, 1, 0])
    mask = allowed_mask(valid, torch.tensor([0, 2]))[0]
    assert mask.tolist() == [[True, True, False], [True, True, False], [False, False, False]]
    with pytest.raises(ValueError, match="token_valid"):
        allowed_mask(torch.tensor([1, 2, 0]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="is_clean"):
        allowed_mask(valid, torch.tensor([0, 2]), is_clean=torch.tensor([0.0, 1.0, 0.0]))
    # official: tail positions (>= cu_seqlens[-1]) take the last segment's id; a valid one joins it
    # (build_spec refuses such packs, the reference rule still states the official mask)
    tail = allowed_mask(torch.tensor([1, 1, 1, 1, 0]), torch.tensor([0, 2, 3]))[0]
    assert tail.tolist() == [[True, True, False, False, False], [True, True, False, False, False],
                             [False, False, True, True, False], [False, False, True, True, False], [False] * 5]
    assert allowed_mask(valid, [0, 2]).equal(allowed_mask(valid, torch.tensor([0, 2])))


def test_allowed_mask_validation_names_the_tensor():
    valid = torch.ones(4, dtype=torch.bool)
    cu = torch.tensor([0, 4])
    with pytest.raises(ValueError, match=r"turn_ids has shape \[1, 3\]; expected \[S\] or \[B, S\] with B=1, S=4"):
        allowed_mask(valid, cu, turn_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="block_ids has dtype torch.float32"):
        allowed_mask(valid, cu, turn_ids=torch.zeros(4, dtype=torch.long), block_ids=torch.zeros(4))
    with pytest.raises(ValueError, match=r"must end at or before S=4, got cu_seqlens\[-1\]=5"):
        allowed_mask(valid, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"cu_seqlens must hold at least 2 entries, got \[0\]"):
        allowed_mask(valid, torch.tensor([0]))


def naive_pair(meta: dict[str, list], q: int, k: int, full: bool) -> bool:
    """The contract's rule table, transcribed literally for one (query, key) pair."""
    if meta["seg"][q] != meta["seg"][k] or not (meta["valid"][q] and meta["valid"][k]):
        return False
    cq, ck = meta["clean"][q], meta["clean"][k]
    tq, tk = meta["turn"][q], meta["turn"][k]
    bq, bk = meta["block"][q], meta["block"][k]
    yq, yk = meta["type"][q], meta["type"][k]
    same, prev = tk == tq, tk < tq
    if not full:
        return (not cq and not ck and same) or (not cq and ck and prev) or (cq and ck and tk <= tq)
    if not cq:
        if yq == 3:
            if not ck:
                return same and ((yk == 3 and bk == bq) or (yk == 1 and bk <= bq))
            return prev or (same and yk == 3 and bk < bq)
        if yq == 4:
            return same if not ck else prev
        return (same and yk != 3) if not ck else prev
    if not ck:
        return False
    if yq == 3:
        return prev or (same and yk in (1, 3) and bk <= bq)
    return prev or (same and yk != 3)


@pytest.mark.parametrize("valid_tail", [False, True])
@pytest.mark.parametrize("full", [True, False])
def test_random_pack_matches_literal_rule_table(full, valid_tail):
    batch = random_pack(seed=3, lengths=[9, 14, 5], tail=3, full_rules=full)
    if valid_tail:  # official: the tail takes the last segment's id (build_spec refuses this pack)
        batch.token_valid[0, 28:] = True
    cu = batch.cu_seqlens.tolist()
    seq_len = batch.seq_len
    meta = {
        "seg": [min(sum(p >= b for b in cu[1:]), len(cu) - 2) for p in range(seq_len)],
        "valid": batch.token_valid[0].tolist(), "clean": batch.is_clean[0].tolist(),
        "turn": batch.turn_ids[0].tolist(), "block": batch.block_ids[0].tolist(),
        "type": batch.type_ids[0].tolist(),
    }
    expected = torch.tensor([[naive_pair(meta, q, k, full) for k in range(seq_len)] for q in range(seq_len)])
    mask = mask_of(batch)
    assert mask.sum() > 0 and (~mask).sum() > 0
    assert mask[:, 28:].any() == valid_tail  # some tail key is seen exactly when the tail is valid
    assert torch.equal(mask, expected)
