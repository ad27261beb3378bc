"""Queries shorter than keys (what a key/value cache needs), and the rows each rule makes final, checked against
a brute-force derivation from the allowed-pairs mask of real built-in-world sequences."""

from __future__ import annotations

import pytest
import torch
from attn_helpers import random_pack
from test_backends import HEAD_DIM, HEADS, KV_HEADS

from lumina.attention import RULES, AttentionRule, attend, build_spec
from lumina.contract import PackedBatch
from lumina.contract.roles import TokenType
from lumina.data.layout_pieces import concat_pieces, layout_text_answer
from lumina.data.packing import collate_pack
from lumina.generation.sequences import Prompt, image_sequence, prompt_piece, text_sequence
from lumina.tokenizers.rvq_quantizer import RVQSettings
from lumina.world.dataset import build_world, fit_world_image_tokenizer

ROW_FIELDS = ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean", "token_valid")


def query_rows(batch: PackedBatch, seed: int) -> tuple[PackedBatch, torch.Tensor]:
    """A random subset of each segment's rows (at least one, in order) plus the last tail row, as a query pack
    with its own cu_seqlens -> (queries, their row indices in `batch`)."""
    g = torch.Generator().manual_seed(seed)
    bounds = batch.seg_bounds
    picked, cu = [], [0]
    for start, end in zip(bounds, bounds[1:], strict=False):
        keep = torch.rand(end - start, generator=g) < 0.4
        keep[torch.randint(0, end - start, (1,), generator=g)] = True
        picked.append(torch.arange(start, end)[keep])
        cu.append(cu[-1] + int(keep.sum()))
    if bounds[-1] < batch.seq_len:
        picked.append(torch.tensor([batch.seq_len - 1]))
    rows = torch.cat(picked)
    fields = {name: getattr(batch, name)[:, rows] for name in ROW_FIELDS}
    return PackedBatch(**fields, cu_seqlens=torch.tensor(cu, dtype=torch.int32), seg_bounds=tuple(cu)), rows


@pytest.mark.parametrize("rule", ["full", "simple"])
@pytest.mark.parametrize("backend", ["sdpa_dense", "segmented", "flex"])
def test_query_subset_equals_those_rows_of_the_full_attention(backend, rule, attend_calls):
    batch = random_pack(11, [40, 23, 40, 31], tail=6)  # block ids in use: "simple" is the named rule, not auto
    queries, rows = query_rows(batch, seed=5)
    assert 0 < queries.seq_len < batch.seq_len
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, HEADS, batch.seq_len, HEAD_DIM, generator=g)
    k, v = (torch.randn(1, KV_HEADS, batch.seq_len, HEAD_DIM, generator=g) for _ in range(2))
    full_spec = build_spec(batch, backend=backend, strict=True, rule=rule)
    sub_spec = build_spec(queries, backend=backend, strict=True, rule=rule, keys=batch)
    assert (sub_spec.seq_len, sub_spec.key_len) == (queries.seq_len, batch.seq_len)
    assert torch.equal(sub_spec.allowed(slice(None), slice(None)),
                       full_spec.allowed(slice(None), slice(None))[:, rows])
    with torch.no_grad():  # flex has no CPU backward
        whole = attend(q, k, v, full_spec)
        part = attend(q[:, :, rows], k, v, sub_spec)
    assert dict(attend_calls) == {backend: 2}  # served by the backend itself, no fallback
    assert part.shape == (1, HEADS, queries.seq_len, HEAD_DIM)
    torch.testing.assert_close(part, whole[:, :, rows], atol=1e-6, rtol=1e-6)
    # and the rule matters: the other rule gives other rows
    other = build_spec(queries, backend=backend, rule="simple" if rule == "full" else "full", keys=batch)
    with torch.no_grad():
        assert not torch.allclose(attend(q[:, :, rows], k, v, other), part, atol=1e-4)


def test_segmented_gradients_of_a_query_subset():
    """The query-subset call's gradients flow to every key row it attends, as the dense reference's do."""
    batch = random_pack(3, [24, 24, 17], tail=3)
    queries, rows = query_rows(batch, seed=1)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, HEADS, queries.seq_len, HEAD_DIM, generator=g)
    k, v = (torch.randn(1, KV_HEADS, batch.seq_len, HEAD_DIM, generator=g) for _ in range(2))
    upstream = torch.randn(1, HEADS, queries.seq_len, HEAD_DIM, generator=g)
    grads = {}
    for backend in ("sdpa_dense", "segmented"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves, build_spec(queries, backend=backend, strict=True, keys=batch))
        grads[backend] = torch.autograd.grad((out * upstream).sum(), leaves)
    for got, ref in zip(grads["segmented"], grads["sdpa_dense"], strict=True):
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def test_keys_must_match_the_query_segments():
    batch = random_pack(0, [8, 8])
    with pytest.raises(ValueError, match=r"keys.seg_bounds \[0, 16\] hold 1 segments, the queries' \[0, 8, 16\] hold 2"):
        build_spec(batch, keys=random_pack(0, [16]))
    with pytest.raises(ValueError, match="keys hold 12 rows, fewer than the 16 query rows"):
        build_spec(batch, keys=random_pack(0, [6, 6]))
    with pytest.raises(ValueError, match="attn_rule='R9': no attention rule of that name; choose one of full, "
                                         "simple"):
        build_spec(batch, rule="R9")


# ---- final rows ----

def brute_force_final(allowed: torch.Tensor, changing: torch.Tensor) -> torch.Tensor:
    """allowed [S, S] (query, key) of every row that exists now or later; changing [S]: rows whose tokens
    change or that do not exist yet. A row is final iff it does not change and every row it attends is final
    (its keys and values at layer l depend on those of the rows it attends at layer l - 1): the greatest
    fixed point, found by peeling rows that attend a non-final one."""
    final = ~changing
    while True:
        peeled = final & ~(allowed & ~final[None, :]).any(dim=1)
        if torch.equal(peeled, final):
            return final
        final = peeled


@pytest.fixture(scope="module")
def world():
    tokenizer = fit_world_image_tokenizer(RVQSettings(kmeans_iters=8), num_images=300)
    return build_world("val", 40, seed=3, image_tokenizer=tokenizer)


def world_prompt(world, image_answer: bool) -> tuple[Prompt, object]:
    """(request, answer part) of the first sample with an image in its prompt whose answer is (not) an image:
    an edit, or a caption / question about an image."""
    for sample in world.dataset.samples:
        answer = sample.turns[-1].parts[0]
        if (getattr(answer, "kind", None) == "image") != image_answer:
            continue
        prompt = Prompt.of_sample(sample, grid=tuple(answer.grid) if image_answer else None)
        if prompt.media:
            return prompt, answer
    raise AssertionError("no such sample in the world")


def decoding_snapshots(world, block_length: int = 4, block_index: int = 2):
    """(now, later) pieces of two real sampler sequences: text decoding at block `block_index` (prompt, BOA,
    committed clean blocks, the noisy current block), where the rows appended later are the current block's
    clean copy and the next noisy block; and an edit's image generation (prompt with its source image, the
    masked answer image), where nothing is appended."""
    tokens = world.tokens
    text_prompt, answer = world_prompt(world, image_answer=False)
    piece = prompt_piece(text_prompt, tokens)
    answer = list(answer.ids)
    finished = (answer * 16)[:block_index * block_length]
    mask = torch.full((block_length,), tokens.text_mask, dtype=torch.long)
    now, _ = text_sequence(piece, finished, mask, block_index, tokens, block_length)
    boa = len(piece)
    decided = (answer * 16)[block_index * block_length:(block_index + 1) * block_length]
    later = [layout_text_answer(decided, tokens, 1, boa, block_length, clean=True, with_boa=False,
                                first_offset=block_index * block_length),
             layout_text_answer(mask, tokens, 1, boa, block_length, clean=False, with_boa=False,
                                first_offset=(block_index + 1) * block_length)]
    image, _ = image_sequence(world_prompt(world, image_answer=True)[0], tokens)
    return [(now, later), (image, [])]


def pack_of(sequences, tokens) -> PackedBatch:
    return collate_pack(sequences, sum(len(s) for s in sequences), tokens.pad, tokens.num_codebooks)


@pytest.mark.parametrize("rule", ["full", "simple"])
def test_final_rows_equal_the_brute_force_derivation_on_world_sequences(world, rule):
    tokens = world.tokens
    snapshots = decoding_snapshots(world)
    spec = build_spec(pack_of([now for now, _ in snapshots], tokens), rule=rule)
    reported = spec.final_rows()[0]
    offset = 0
    for now, later in snapshots:
        union = pack_of([concat_pieces([now, *later], now.sample_id)], tokens)
        allowed = build_spec(union, rule=rule).allowed(slice(None), slice(None))[0]
        answer = (union.type_ids[0] == TokenType.TEXT_ANSWER) | (union.type_ids[0] == TokenType.IMAGE_ANSWER)
        changing = answer & ~union.is_clean[0]
        changing[len(now):] = True  # appended later: its keys differ from "nothing"
        expected = brute_force_final(allowed, changing)[:len(now)]
        assert torch.equal(reported[offset:offset + len(now)], expected), (rule, now.sample_id)
        offset += len(now)

    # what issue 43 reads off the rule, stated directly on the text snapshot
    text, _ = snapshots[0]
    rows = reported[:len(text)]
    prompt = text.turn_ids == 0
    boa = (text.turn_ids == 1) & (text.type_ids == TokenType.TEXT)
    committed = (text.type_ids == TokenType.TEXT_ANSWER) & text.is_clean
    current = (text.type_ids == TokenType.TEXT_ANSWER) & ~text.is_clean
    assert prompt.sum() > 20 and boa.sum() == 1 and committed.sum() == 8 and current.sum() == 4
    assert rows[prompt].all() and not rows[current].any()
    if rule == "full":  # R6-R8: the BOA and the committed blocks are final
        assert rows[boa].all() and rows[committed].all()
    else:  # S3: a clean answer row attends every clean row of its turn, later blocks included; S1: the BOA
        # attends the noisy block
        assert not rows[boa].any() and not rows[committed].any()
    image, _ = snapshots[1]
    image_rows = reported[len(text):]
    assert image_rows[image.turn_ids == 0].all() and not image_rows[image.turn_ids == 1].any()


def test_a_rule_that_reports_nothing_final_and_user_rules_by_dotted_path():
    """The protocol's default: no final row. A rule of the user's own is named by its dotted path."""
    batch = random_pack(0, [10, 6])
    spec = build_spec(batch, rule=f"{__name__}.EverythingVisible")
    assert isinstance(spec.rule, EverythingVisible)
    assert not spec.final_rows().any()
    allowed = spec.allowed(slice(None), slice(None))[0]
    valid = batch.token_valid[0]
    same = spec.queries.seg_id[0][:, None] == spec.queries.seg_id[0][None, :]
    assert torch.equal(allowed, same & valid[:, None] & valid[None, :])
    assert set(RULES.names()) == {"full", "simple"} and RULES.is_official("full")


class EverythingVisible(AttentionRule):
    def allow(self, q, k):
        return torch.ones_like(q.is_clean & k.is_clean)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flex", "flash_varlen"])
def test_query_subset_on_cuda(backend, attend_calls):
    """flex (with gradients) and flash_varlen (plain segments: separate query and key cu_seqlens) on CUDA."""
    if backend == "flash_varlen":
        pytest.importorskip("flash_attn")
    batch = random_pack(4, [100, 37, 211, 100], tail=64, invalid_frac=0.0)
    if backend == "flash_varlen":
        batch.block_ids.fill_(-1)
        batch.is_clean.fill_(True)
        batch.turn_ids.fill_(0)
    queries, rows = query_rows(batch, seed=2)
    batch, queries, rows = batch.to("cuda"), queries.to("cuda"), rows.cuda()
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, HEADS, batch.seq_len, HEAD_DIM, generator=g).cuda().bfloat16()
    k, v = (torch.randn(1, KV_HEADS, batch.seq_len, HEAD_DIM, generator=g).cuda().bfloat16() for _ in range(2))
    whole = attend(q, k, v, build_spec(batch, backend=backend, strict=True))
    part = attend(q[:, :, rows], k, v, build_spec(queries, backend=backend, strict=True, keys=batch))
    assert dict(attend_calls) == {backend: 2}
    torch.testing.assert_close(part, whole[:, :, rows], atol=2e-2, rtol=2e-2)
