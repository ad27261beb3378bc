"""Layout cases with hand-derived expectations (row by row) and their attention visibility."""

import pytest
import torch
from sample_helpers import NEWLINE

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.noise import NoiseConfig, cfg_dropout
from lumina.data.sequence_layout import laid_out_length, layout_eval, layout_sample

NO_CFG = NoiseConfig(block_length=4, uncond_text_prob=0.0, uncond_image_prob=0.0)
MASK, IMG_MASK, IGN = 156895, 5000, -100


def rows(a: int, b: int) -> list[int]:
    return list(range(a, b))


def text_qa() -> Sample:
    return Sample("qa", [Turn("system", [Text([1, 2])]), Turn("user", [Text([5, 6, 7])]),
                         Turn("assistant", [Text(list(range(10, 19)))])])


def test_text_qa_rows(tokens, keys_of, visible):
    seq = layout_eval(text_qa(), tokens, NO_CFG, seed=0, t=0.5)
    # <system> 1 2 </system> <user> 5 6 7 </user> | BOA | 10..18 EOA (offsets 0..9) | memory 10..18 EOA
    assert len(seq) == 9 + 1 + 10 + 10 == laid_out_length(text_qa(), tokens)
    col0 = seq.input_ids[:, 0]
    assert col0[:10].tolist() == [157153, 1, 2, 157154, 157155, 5, 6, 7, 157157, 157165]
    assert torch.all(seq.input_ids == col0[:, None])  # text ids fill every column
    answer = [*range(10, 19), 157166]
    assert col0[20:].tolist() == answer  # memory is the clean answer, no BOA
    assert seq.type_ids.tolist() == [1] * 10 + [3] * 20
    assert seq.turn_ids.tolist() == [0] * 9 + [1] * 21
    assert seq.is_clean.tolist() == [True] * 9 + [False] * 11 + [True] * 10
    blocks = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]  # offset // 4
    assert seq.block_ids.tolist() == [-1] * 9 + [0] + blocks + blocks
    assert seq.position_ids.tolist() == rows(0, 20) + rows(10, 20)
    # noisy copy: masked rows hold the mask id and are labelled with the original id
    noisy, labels = col0[10:20], seq.labels[10:20, 0]
    masked = noisy == MASK
    assert torch.equal(labels[masked], torch.tensor(answer)[masked])
    assert torch.all(labels[~masked] == IGN) and torch.equal(noisy[~masked], torch.tensor(answer)[~masked])
    assert all(masked[i:i + 4].any() for i in (0, 4, 8))  # >= 1 masked per block
    assert torch.all(seq.labels[:10] == IGN) and torch.all(seq.labels[20:] == IGN)
    assert torch.all(seq.labels[10:20] == seq.labels[10:20, :1])
    assert seq.noise_t.tolist() == [0.0] * 10 + [0.5] * 10 + [0.0] * 10
    assert seq.answer_mask.tolist() == [False] * 10 + [True] * 10 + [False] * 10
    # visibility
    prompt = rows(0, 9)
    assert keys_of(seq, 3) == prompt  # clean prompt sees only its own turn
    assert keys_of(seq, 9) == rows(0, 10)  # BOA: clean prompt + itself
    # block 1: BOA + its own noisy block + the clean memory of block 0
    assert keys_of(seq, 14) == prompt + [9] + rows(14, 18) + rows(20, 24)
    assert keys_of(seq, 10) == prompt + [9] + rows(10, 14)  # block 0: never its own clean copy (20..23)
    assert keys_of(seq, 24) == prompt + rows(20, 28)  # memory block 1: clean prompt + memory blocks <= 1
    v = visible(seq)
    assert not v[seq.is_clean][:, ~seq.is_clean].any()  # clean rows never see noisy ones


def test_text_qa_training_noise_t_per_block(tokens):
    cfg = NoiseConfig(block_length=4, t_min=0.2, t_max=0.7)
    seq = layout_sample(text_qa(), tokens, cfg, seed=5, epoch=2)
    t = seq.noise_t[10:20]
    assert t[:4].unique().numel() == 1 and t[4:8].unique().numel() == 1 and t[8:].unique().numel() == 1
    assert t.min() >= 0.2 and t.max() <= 0.7


def test_masked_fraction_follows_t_over_epochs(tokens):
    answer = list(range(10, 10 + 319))  # + EOA = 320 rows = 10 blocks of 32
    sample = Sample("long", [Turn("user", [Text([5])]), Turn("assistant", [Text(answer)])])
    cfg = NoiseConfig(t_min=0.25, t_max=0.25)
    masked = torch.stack([layout_sample(sample, tokens, cfg, seed=0, epoch=e).input_ids[4:324, 0] == MASK
                          for e in range(50)])
    n = masked.numel()
    # 16000 Bernoulli(0.25): sd of the mean 0.0034; 5 sd (forced masks: P(empty block) = 0.75^32 ~ 1e-4)
    assert abs(masked.float().mean().item() - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5


def multi_turn() -> Sample:
    return Sample("mt", [Turn("user", [Text([5])]), Turn("assistant", [Text([10, 11])]),
                         Turn("user", [Text([6])]), Turn("assistant", [Text([12])])])


def test_multi_turn_rows_and_visibility(tokens, keys_of):
    seq = layout_eval(multi_turn(), tokens, NoiseConfig(), seed=0, t=0.5)
    # <user>5</user> | BOA 10 11 EOA | <user>6</user> | BOA 12 EOA | mem(10 11 EOA) | mem(12 EOA)
    assert len(seq) == 18 == laid_out_length(multi_turn(), tokens)
    assert seq.turn_ids.tolist() == [0] * 3 + [1] * 4 + [2] * 3 + [3] * 3 + [1] * 3 + [3] * 2
    assert seq.type_ids.tolist() == [1] * 3 + [1, 3, 3, 3] + [1] * 3 + [1, 3, 3] + [3] * 5
    assert seq.is_clean.tolist() == [True] * 3 + [False] * 4 + [True] * 3 + [False] * 3 + [True] * 5
    assert seq.block_ids.tolist() == [-1] * 3 + [0] * 4 + [-1] * 3 + [0] * 3 + [0] * 5
    assert seq.position_ids.tolist() == rows(0, 13) + [4, 5, 6, 11, 12]
    assert seq.input_ids[13:, 0].tolist() == [10, 11, 157166, 12, 157166]
    assert seq.answer_mask.nonzero().flatten().tolist() == [4, 5, 6, 11, 12]
    assert keys_of(seq, 8) == [0, 1, 2, 7, 8, 9, 13, 14, 15]  # 2nd prompt: 1st prompt + 1st answer's memory
    assert keys_of(seq, 11) == [0, 1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15]  # 2nd answer: clean earlier turns
    assert keys_of(seq, 4) == rows(0, 7)  # 1st answer: never its own clean copy
    assert keys_of(seq, 16) == [0, 1, 2, 7, 8, 9, 13, 14, 15, 16, 17]


def t2i(codes) -> Sample:
    return Sample("t2i", [Turn("user", [Text([5, 6])]), Turn("assistant", [Media("image", codes, (2, 3))])])


def test_text_to_image_rows_and_visibility(tokens, keys_of, random_codes):
    codes = random_codes(6)
    seq = layout_eval(t2i(codes), tokens, NO_CFG, seed=0, t=0.5)
    # <user> 5 6 </user> | BOA BOI c c c 5001 c c c 5001 EOI EOA
    assert len(seq) == 16 == laid_out_length(t2i(codes), tokens)
    assert seq.input_ids[:6, 0].tolist() == [157155, 5, 6, 157157, 157165, 157167]
    assert seq.input_ids[14:, 0].tolist() == [157168, 157166]
    assert torch.all(seq.input_ids[[9, 13]] == 5001)
    assert seq.type_ids.tolist() == [1] * 6 + [4] * 8 + [1] * 2
    assert seq.turn_ids.tolist() == [0] * 4 + [1] * 12
    assert seq.block_ids.tolist() == [-1] * 4 + [0] * 12
    assert seq.is_clean.tolist() == [True] * 4 + [False] * 12
    assert seq.position_ids.tolist() == rows(0, 16)
    cells = [6, 7, 8, 10, 11, 12]
    masked = [r for r in cells if seq.input_ids[r, 0] == IMG_MASK]
    assert len(masked) == 3  # ceil(0.5 * 6)
    for i, r in enumerate(cells):
        if r in masked:
            assert torch.all(seq.input_ids[r] == IMG_MASK) and torch.equal(seq.labels[r], codes[i])
        else:
            assert torch.equal(seq.input_ids[r], codes[i]) and torch.all(seq.labels[r] == IGN)
    assert torch.all(seq.labels[[0, 1, 2, 3, 4, 5, 9, 13, 14, 15]] == IGN)  # markers never supervised
    assert seq.noise_t[cells].tolist() == [0.5] * 6 and seq.noise_t.sum().item() == 3.0
    assert seq.answer_mask.nonzero().flatten().tolist() == cells
    assert keys_of(seq, 7) == rows(0, 16)  # noisy image: clean prompt + the whole noisy answer
    assert keys_of(seq, 5) == rows(0, 16)  # BOI (type 1, noisy): same
    assert keys_of(seq, 2) == rows(0, 4)  # prompt never sees the answer


def understanding(codes) -> Sample:
    return Sample("mmu", [Turn("user", [Media("image", codes, (2, 2)), Text([5])]),
                          Turn("assistant", [Text([10])])])


def test_understanding_rows_and_visibility(tokens, keys_of, random_codes):
    codes = random_codes(4, seed=1)
    cfg = NoiseConfig(uncond_text_prob=1.0, uncond_image_prob=1.0)  # CFG dropout never touches text answers
    seq = layout_sample(understanding(codes), tokens, cfg, seed=0, epoch=0)
    # <user> BOI c c 5001 c c 5001 EOI \n 5 </user> | BOA 10 EOA | mem 10 EOA  (the official "<IMG_CONTEXT>\n5")
    assert len(seq) == 17 == laid_out_length(understanding(codes), tokens, drop_text=True, drop_image=True)
    assert seq.input_ids[[0, 1, 8, 9, 10, 11, 12], 0].tolist() == [157155, 157167, 157168, NEWLINE, 5, 157157,
                                                                   157165]
    assert torch.equal(seq.input_ids[[2, 3, 5, 6]], codes)
    assert torch.all(seq.input_ids[[4, 7]] == 5001)
    assert seq.type_ids.tolist() == [1, 1] + [2] * 6 + [1] * 5 + [3] * 4
    assert seq.turn_ids.tolist() == [0] * 12 + [1] * 5
    assert seq.is_clean.tolist() == [True] * 12 + [False] * 3 + [True] * 2
    assert seq.position_ids.tolist() == rows(0, 15) + [13, 14]
    assert seq.block_ids.tolist() == [-1] * 12 + [0] * 5
    answer = torch.tensor([10, 157166])
    masked = seq.input_ids[13:15, 0] == 156895
    assert masked.any()  # one block -> at least one masked row
    assert torch.equal(seq.labels[13:15, 0][masked], answer[masked])
    assert torch.all(seq.labels[13:15, 0][~masked] == IGN)
    assert torch.all(seq.labels[:13] == IGN) and torch.all(seq.labels[15:] == IGN)
    t = seq.noise_t[13].item()
    assert seq.noise_t.tolist() == [0.0] * 13 + [t, t, 0.0, 0.0] and 1e-3 <= t <= 1.0
    assert keys_of(seq, 13) == rows(0, 15)  # answer sees the whole clean prompt incl. media, BOA, its block
    assert keys_of(seq, 3) == rows(0, 12)


def edit(src, out) -> Sample:
    return Sample("edit", [Turn("user", [Media("image", src, (1, 2)), Text([5, 6])]),
                           Turn("assistant", [Media("image", out, (2, 1))])])


@pytest.mark.parametrize("p_text, p_image, prompt", [
    (0.0, 0.0, [157155, 157167, "c0", "c1", 5001, 157168, NEWLINE, 5, 6, 157157]),
    (1.0, 0.0, [157155, 157167, "c0", "c1", 5001, 157168, NEWLINE, 157156, 157157]),  # "<IMG_CONTEXT>\n<uncondition>"
    (0.0, 1.0, [157155, 5, 6, 157157]),
    (1.0, 1.0, [157155, 157156, 157157]),
])
def test_editing_with_cfg_dropout(tokens, keys_of, random_codes, p_text, p_image, prompt):
    src, out = random_codes(2, seed=2), random_codes(2, seed=3)
    cfg = NoiseConfig(uncond_text_prob=p_text, uncond_image_prob=p_image)
    seq = layout_sample(edit(src, out), tokens, cfg, seed=0, epoch=0)
    p = len(prompt)
    assert len(seq) == p + 8 == laid_out_length(edit(src, out), tokens, p_text == 1.0, p_image == 1.0)
    decisions = cfg_dropout(0, 0, edit(src, out).id, cfg)  # the seeded CFG decisions layout_sample took
    assert laid_out_length(edit(src, out), tokens, *decisions) == p + 8
    for r, want in enumerate(prompt):
        if isinstance(want, str):
            assert torch.equal(seq.input_ids[r], src[int(want[1])]) and seq.type_ids[r] == 2
        else:
            assert torch.all(seq.input_ids[r] == want)
            assert seq.type_ids[r] == (2 if want == 5001 else 1)
    # answer: BOA BOI c 5001 c 5001 EOI EOA
    assert seq.input_ids[p:, 0].tolist()[:2] == [157165, 157167]
    assert seq.input_ids[p + 6:, 0].tolist() == [157168, 157166]
    assert seq.type_ids[p:].tolist() == [1, 1, 4, 4, 4, 4, 1, 1]
    assert seq.turn_ids.tolist() == [0] * p + [1] * 8
    assert seq.is_clean.tolist() == [True] * p + [False] * 8
    assert seq.block_ids.tolist() == [-1] * p + [0] * 8
    assert seq.position_ids.tolist() == rows(0, p + 8)
    cells = [p + 2, p + 4]
    masked = [i for i, r in enumerate(cells) if seq.input_ids[r, 0] == 5000]
    assert len(masked) >= 1
    for i, r in enumerate(cells):
        want_label = out[i] if i in masked else torch.full((8,), IGN)
        assert torch.equal(seq.labels[r], want_label)
    assert torch.all(seq.labels[[r for r in range(p + 8) if r not in cells]] == IGN)
    assert seq.noise_t[cells].tolist() == [len(masked) / 2] * 2  # the masked fraction of the grid
    assert seq.answer_mask.nonzero().flatten().tolist() == cells
    assert keys_of(seq, p + 2) == rows(0, p + 8)


def media_prompt(kind, grid, codes) -> Sample:
    return Sample(kind, [Turn("user", [Media(kind, codes, grid)]), Turn("assistant", [Text([10])])])


def test_video_in_prompt(tokens, random_codes, keys_of):
    codes = random_codes(4, seed=4)  # grid (t=2, h=1, w=2): code index = t*2 + x
    seq = layout_eval(media_prompt("video", (2, 1, 2), codes), tokens, NO_CFG, seed=0, t=0.5)
    # <user> BOV c0 c1 5004 5005 c2 c3 5004 5005 EOV </user> | BOA 10 EOA | mem
    assert len(seq) == 12 + 3 + 2 == laid_out_length(media_prompt("video", (2, 1, 2), codes), tokens)
    assert seq.input_ids[[0, 1, 10, 11, 12], 0].tolist() == [157155, 157171, 157172, 157157, 157165]
    assert torch.equal(seq.input_ids[[2, 3, 6, 7]], codes)
    assert torch.all(seq.input_ids[[4, 8]] == 5004) and torch.all(seq.input_ids[[5, 9]] == 5005)
    assert seq.type_ids[:12].tolist() == [1, 1] + [2] * 8 + [1, 1]
    assert seq.is_clean.tolist() == [True] * 12 + [False] * 3 + [True] * 2
    assert seq.turn_ids.tolist() == [0] * 12 + [1] * 5
    assert seq.block_ids.tolist() == [-1] * 12 + [0] * 5
    assert seq.position_ids.tolist() == rows(0, 15) + [13, 14]
    assert torch.all(seq.labels[:13] == IGN) and seq.noise_t[:13].sum() == 0
    assert keys_of(seq, 13) == rows(0, 15)


def test_mesh3d_in_prompt(tokens, random_codes):
    codes = random_codes(4, seed=5)  # grid (z=2, y=2, x=1): code index = z*2 + y
    seq = layout_eval(media_prompt("mesh3d", (2, 2, 1), codes), tokens, NO_CFG, seed=0, t=0.5)
    # <user> BO3d c0 5002 c1 5002 5003 c2 5002 c3 5002 5003 EO3d </user> | BOA 10 EOA | mem
    assert len(seq) == 14 + 3 + 2 == laid_out_length(media_prompt("mesh3d", (2, 2, 1), codes), tokens)
    assert seq.input_ids[[0, 1, 12, 13], 0].tolist() == [157155, 157169, 157170, 157157]
    assert torch.equal(seq.input_ids[[2, 4, 7, 9]], codes)
    assert torch.all(seq.input_ids[[3, 5, 8, 10]] == 5002) and torch.all(seq.input_ids[[6, 11]] == 5003)
    assert seq.type_ids[:14].tolist() == [1, 1] + [2] * 10 + [1, 1]


def test_small_token_space(random_codes):
    from lumina.contract.special_tokens import SpecialTokens

    tok = SpecialTokens(text_vocab_size=512, pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7,
                        bo3d=8, eo3d=9, system_open=10, system_close=11, user_open=12, user_close=13,
                        uncondition=14, codebook_size=64, num_codebooks=4)

    def small(codes):
        return Sample("small", [Turn("user", [Text([20, 21])]),
                                Turn("assistant", [Media("image", codes, (2, 3))])])

    seq = layout_eval(small(random_codes(6, num_codebooks=4, high=64)), tok, NO_CFG, seed=0, t=1.0)
    assert seq.input_ids.shape == (16, 4)
    assert seq.input_ids[:6, 0].tolist() == [12, 20, 21, 13, 2, 4]
    assert torch.all(seq.input_ids[[6, 7, 8, 10, 11, 12]] == 5000)
    with pytest.raises(ValueError, match=r"sample 'small'.*turns\[1\]\.parts\[0\]\.codes has values outside"):
        layout_eval(small(random_codes(6, num_codebooks=4, high=4096)), tok, NO_CFG, seed=0, t=1.0)


def test_reproducible_per_epoch_and_sample(tokens):
    sample = Sample("r", [Turn("user", [Text([5])]), Turn("assistant", [Text(list(range(10, 74)))])])
    cfg = NoiseConfig()
    a, b = layout_sample(sample, tokens, cfg, 1, 3), layout_sample(sample, tokens, cfg, 1, 3)
    for f in ("input_ids", "labels", "noise_t"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    other_epoch = layout_sample(sample, tokens, cfg, 1, 4)
    renamed = layout_sample(Sample("r2", sample.turns), tokens, cfg, 1, 3)
    assert not torch.equal(a.input_ids, other_epoch.input_ids)
    assert not torch.equal(a.input_ids, renamed.input_ids)
