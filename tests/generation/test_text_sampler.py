"""The block-diffusion text sampler on the real tiny model: fixed heads, EOA stop, layout, schedule, seeds."""

from __future__ import annotations

import pytest
import torch
from gen_helpers import record_backbone_packs

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import layout_eval
from lumina.generation import Prompt, TextSamplingConfig, generate_text
from lumina.generation.sampling import filter_top_k_top_p


def _favour_token(model, token: int, margin: float = 30.0) -> None:
    """Every final hidden state gets a dominant, positive dimension 0 (the word embeddings carry +1000 there,
    the final norm keeps only that dimension), and lm_head scores `token` by `margin` there, others 0."""
    with torch.no_grad():
        model.model.word_embeddings.weight[:, 0] += 1000.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[token, 0] = margin / 8.0  # h_0 = sqrt(H) = 8 for a one-hot residual direction


def test_fixed_head_decodes_the_favoured_token_in_every_slot(tiny_model, tokens):
    _favour_token(tiny_model, 77)
    seen = record_backbone_packs(tiny_model)
    config = TextSamplingConfig(gen_length=16, block_length=8, steps=4, temperature=1.0)
    (answer,) = generate_text(tiny_model, [Prompt([Text([20, 21])], key=0)], tokens, config)
    assert answer.ids == [77] * 16 and not answer.finished
    assert len(seen) == 2 * 4  # two blocks of four steps, one forward each


def test_eoa_stops_after_its_block_and_cuts_the_answer(tiny_model, tokens):
    _favour_token(tiny_model, tokens.eoa)
    seen = record_backbone_packs(tiny_model)
    config = TextSamplingConfig(gen_length=32, block_length=8, steps=2)
    (answer,) = generate_text(tiny_model, [Prompt([Text([20, 21])], key=0)], tokens, config)
    assert answer.finished and answer.ids == [] and answer.raw == [tokens.eoa] * 8
    assert len(seen) == 2  # one block only


def test_commits_per_step_follow_the_linear_schedule(tiny_model, tokens):
    seen = record_backbone_packs(tiny_model)
    config = TextSamplingConfig(gen_length=7, block_length=7, steps=3)
    generate_text(tiny_model, [Prompt([Text([20])], key=0)], tokens, config)
    masked_before = [int((b.input_ids[0, -7:, 0] == tokens.text_mask).sum()) for b in seen]
    assert masked_before == [7, 7 - 3, 7 - 3 - 2]  # 7 tokens over 3 steps: 3, 2, 2


def test_first_step_sequence_is_the_training_layout_fully_masked_without_memory(tiny_model, tokens):
    block = 8
    answer = [30, 31, 32, 33, 34, 35, 36]  # + EOA = one full block
    image = Media("image", torch.arange(16).reshape(4, 4) % 64, (2, 2))
    sample = Sample("s", [Turn("system", [Text([15, 16])]), Turn("user", [image, Text([40, 41])]),
                          Turn("assistant", [Text(answer)])])
    expected = layout_eval(sample, tokens, NoiseConfig(block_length=block), seed=0, t=1.0)
    memory_rows = len(answer) + 1
    seen = record_backbone_packs(tiny_model)
    prompt = Prompt([image, Text([40, 41])], system=[15, 16], key=0)
    generate_text(tiny_model, [prompt], tokens, TextSamplingConfig(gen_length=block, block_length=block, steps=2))
    first = seen[0]
    assert first.seq_len == len(expected) - memory_rows
    for name in ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean"):
        assert torch.equal(getattr(first, name)[0], getattr(expected, name)[:-memory_rows]), name


def test_finished_blocks_are_clean_like_the_answer_memory(tiny_model, tokens):
    block = 4
    seen = record_backbone_packs(tiny_model)
    generate_text(tiny_model, [Prompt([Text([20, 21, 22])], key=0)], tokens,
                  TextSamplingConfig(gen_length=8, block_length=block, cache=False, steps=2))
    second_block = seen[2]  # steps 0, 1 decode block 0; step 2 is the first of block 1
    prompt_len = 5
    rows = slice(prompt_len + 1, prompt_len + 1 + block)  # block 0's answer rows after BOA
    assert second_block.is_clean[0, rows].all()
    assert torch.equal(second_block.position_ids[0, rows], torch.arange(prompt_len + 1, prompt_len + 1 + block))
    assert (second_block.block_ids[0, rows] == 0).all() and (second_block.block_ids[0, -block:] == 1).all()
    assert not second_block.is_clean[0, -block:].any()
    assert (second_block.input_ids[0, rows, 0] != tokens.text_mask).all()
    assert (second_block.input_ids[0, -block:, 0] == tokens.text_mask).all()


def test_seeded_and_batch_independent(tiny_model, tokens):
    prompts = [Prompt([Text([20 + i, 21])], key=i) for i in range(3)]
    config = TextSamplingConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, batch_size=3)
    together = generate_text(tiny_model, prompts, tokens, config)
    again = generate_text(tiny_model, prompts, tokens, config)
    one_by_one = generate_text(tiny_model, prompts, tokens, TextSamplingConfig(
        gen_length=8, block_length=4, steps=2, temperature=1.0, batch_size=1))
    other = generate_text(tiny_model, prompts, tokens, TextSamplingConfig(
        gen_length=8, block_length=4, steps=2, temperature=1.0, seed=5))
    assert [a.raw for a in together] == [a.raw for a in again] == [a.raw for a in one_by_one]
    assert [a.raw for a in together] != [a.raw for a in other]


def test_threshold_commits_every_confident_slot_at_once(tiny_model, tokens):
    _favour_token(tiny_model, 77)  # every slot has confidence ~1
    seen = record_backbone_packs(tiny_model)
    config = TextSamplingConfig(gen_length=8, block_length=8, steps=8, threshold=0.9)
    (answer,) = generate_text(tiny_model, [Prompt([Text([20])], key=0)], tokens, config)
    assert answer.raw == [77] * 8
    assert len(seen) == 1  # the whole block in the first step


def test_top_k_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_top_k_top_p(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p = 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it -> keep two
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.85)).tolist() == [[False, False, False, True]]


def test_partial_last_block_stops_at_gen_length(tiny_model, tokens):
    """gen_length 12 in blocks of 8: a block of 8, then one of 4 (the official `cur_block_len`), 12 slots."""
    _favour_token(tiny_model, 77)
    seen = record_backbone_packs(tiny_model)
    config = TextSamplingConfig(gen_length=12, block_length=8, cache=False, steps=4)
    (answer,) = generate_text(tiny_model, [Prompt([Text([20, 21])], key=0)], tokens, config)
    assert answer.ids == [77] * 12
    last = seen[-1]
    assert int((last.input_ids[0, :, 0] == tokens.text_mask).sum()) == 1  # the last of 4 masked slots
    assert last.input_ids.shape[1] == seen[0].input_ids.shape[1] + 4  # P + BOA + 8 clean + 4 vs P + BOA + 8
    assert last.block_ids[0, -4:].tolist() == [1] * 4 and len(seen) == 4 + 4


def test_steps_beyond_the_block_commit_nothing_and_are_skipped(tiny_model, tokens):
    """12 steps on a 4-slot block: one slot per step for 4 steps (1, 1, 1, 1, 0, ...), the zero steps run no
    forward; the answer equals the 4-step one."""
    prompt = [Prompt([Text([20, 21, 22])], key=0)]
    seen = record_backbone_packs(tiny_model)
    (many,) = generate_text(tiny_model, prompt, tokens, TextSamplingConfig(gen_length=4, block_length=4, steps=12))
    assert len(seen) == 4
    assert [int((b.input_ids[0, -4:, 0] == tokens.text_mask).sum()) for b in seen] == [4, 3, 2, 1]
    (four,) = generate_text(tiny_model, prompt, tokens, TextSamplingConfig(gen_length=4, block_length=4, steps=4))
    assert many.raw == four.raw


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="steps"):
        TextSamplingConfig(block_length=4, steps=0)
    with pytest.raises(ValueError, match="threshold"):
        TextSamplingConfig(threshold=1.5)


def test_commits_are_the_most_confident_argmax_slots(tiny_model, tokens):
    """At temperature 0 each step commits, per the linear schedule, the masked slots whose softmax probability
    of their argmax token is highest, with that token; reference: a separate forward of each step's input."""
    seen = record_backbone_packs(tiny_model)
    block, steps = 8, 4
    (answer,) = generate_text(tiny_model, [Prompt([Text([20, 21, 22])], key=0)], tokens,
                              TextSamplingConfig(gen_length=block, block_length=block, cache=False, steps=steps))
    del tiny_model.backbone  # the recording wrapper; the model's own method again
    assert len(seen) == steps
    outcomes = [b.input_ids[0, -block:, 0] for b in seen[1:]] + [torch.tensor(answer.raw)]
    for step in range(steps):
        before = seen[step].input_ids[0, -block:, 0]
        with torch.no_grad():
            logits = tiny_model.heads().text_logits(tiny_model.backbone(seen[step])[0, -block:]).double()
        best_p, best_id = torch.softmax(logits, dim=-1).max(dim=-1)
        masked = [i for i in range(block) if before[i] == tokens.text_mask]
        expected = before.clone()
        for i in sorted(masked, key=lambda i: -best_p[i].item())[:block // steps]:
            expected[i] = best_id[i]
        assert torch.equal(outcomes[step], expected), step


def test_defaults_are_the_official_ones():
    """Contract 6.2 (text: 1024 tokens, blocks of 32, 32 steps, temperature 0, no threshold, seed 65513) and
    6.3 (text-to-image: 96 steps, s = 3.0, temperature 1.0, single guidance)."""
    from lumina.generation import ImageSamplingConfig

    text = TextSamplingConfig()
    assert (text.gen_length, text.block_length, text.steps, text.temperature, text.threshold, text.seed) == (
        1024, 32, 32, 0.0, None, 65513)
    image = ImageSamplingConfig()
    assert (image.steps, image.cfg_scale, image.temperature, image.dual, image.seed) == (96, 3.0, 1.0, False, 65513)


def test_third_block_metadata_by_hand(tiny_model, tokens):
    """Contract 6.2 at block 2 (block_length 3): prompt clean in turn 0 with block -1; BOA noisy, turn 1, block
    0, type 1 at position P; finished answers clean, type 3, block offset // 3; the current block noisy."""
    seen = record_backbone_packs(tiny_model)
    generate_text(tiny_model, [Prompt([Text([30, 31])], key=0)], tokens,
                  TextSamplingConfig(gen_length=9, block_length=3, cache=False, steps=1))
    third = seen[2]
    user = [tokens.user_open, 30, 31, tokens.user_close]
    assert third.input_ids[0, :5, 0].tolist() == user + [tokens.boa]
    assert third.input_ids[0, -3:, 0].tolist() == [tokens.text_mask] * 3
    assert (third.input_ids[0, 5:11, 0] != tokens.text_mask).all()
    assert third.type_ids[0].tolist() == [1] * 5 + [3] * 9
    assert third.turn_ids[0].tolist() == [0] * 4 + [1] * 10
    assert third.block_ids[0].tolist() == [-1] * 4 + [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert third.position_ids[0].tolist() == list(range(14))
    assert third.is_clean[0].tolist() == [True] * 4 + [False] + [True] * 6 + [False] * 3
