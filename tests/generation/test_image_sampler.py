"""The text-to-image / editing sampler on the real tiny model: guidance, schedule, fixed heads, layout."""

from __future__ import annotations

import math
import re

import pytest
import torch
from gen_helpers import record_backbone_packs

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.layout_pieces import concat_pieces, layout_image_answer, layout_prompt
from lumina.data.noise import NoiseConfig
from lumina.data.packing import collate_pack
from lumina.data.sequence_layout import layout_eval
from lumina.generation import ImageSamplingConfig, Prompt, StepTrace, generate_images


def _single_forward_rows(model, sequence, rows):
    batch = collate_pack([sequence], len(sequence), 0, sequence.input_ids.shape[1])
    with torch.no_grad():
        return model.backbone(batch)[0, rows]


def test_first_step_guidance_equals_two_separate_forwards(tiny_model, tokens):
    s = 2.0
    grid = (2, 3)
    prompt_ids = [20, 21, 22]
    trace: list[StepTrace] = []
    generate_images(tiny_model, [Prompt([Text(prompt_ids)], key=7, grid=grid)], tokens,
                    ImageSamplingConfig(steps=3, cfg_scale=s), trace=trace)
    # the two branches built by hand: conditional prompt, and the <uncondition> prompt
    cells = [2 + r * (grid[1] + 1) + c for r in range(grid[0]) for c in range(grid[1])]
    hidden = []
    for ids in (prompt_ids, [tokens.uncondition]):
        head = layout_prompt([Text(ids)], tokens)
        seq = concat_pieces([head, layout_image_answer(grid, tokens, turn=1, start_position=len(head))], "x")
        hidden.append(_single_forward_rows(tiny_model, seq, torch.tensor(cells) + len(head)))
    h_c, h_u = hidden
    assert not torch.allclose(h_c, h_u, atol=1e-3)  # the branches really differ
    expected = (1 + s) * h_c - s * h_u
    torch.testing.assert_close(trace[0].guided[0], expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(trace[0].guided[0], h_c, atol=1e-3)


@torch.no_grad()
def test_logit_guidance_combines_each_codebooks_logits_and_feeds_both_branches_the_same_code(tiny_model, tokens):
    """guidance="logits", one argmax step: every cell's code c is argmax((1 + s) l_c - s l_u), where l_c and l_u
    are the channel head's logits on the conditional and <uncondition> branches, each fed the codes chosen so
    far; a reference written here from the model's parts."""
    s, grid, prompt_ids = 2.0, (2, 3), [20, 21, 22]
    config = ImageSamplingConfig(steps=1, temperature=0.0, cfg_scale=s, guidance="logits")
    (answer,) = generate_images(tiny_model, [Prompt([Text(prompt_ids)], key=7, grid=grid)], tokens, config)
    cells = torch.tensor([2 + r * (grid[1] + 1) + c for r in range(grid[0]) for c in range(grid[1])])
    hidden = []
    for ids in (prompt_ids, [tokens.uncondition]):
        head = layout_prompt([Text(ids)], tokens)
        seq = concat_pieces([head, layout_image_answer(grid, tokens, turn=1, start_position=len(head))], "x")
        hidden.append(_single_forward_rows(tiny_model, seq, cells + len(head)))
    channel = tiny_model.multi_codebook_head
    conds = [channel.condition_proj(h) for h in hidden]
    prefixes = [c.new_zeros(c.shape[0], 0, c.shape[-1]) for c in conds]
    expected, plain = [], []
    for c in range(tokens.num_codebooks):
        logits = [tiny_model.lm_img_head[c](channel.run(cond, prefix)[:, -1])
                  for cond, prefix in zip(conds, prefixes, strict=True)]
        code = ((1 + s) * logits[0] - s * logits[1]).argmax(-1)
        expected.append(code)
        plain.append(logits[0].argmax(-1))
        embedded = tiny_model.model.img_embeddings[c](code).unsqueeze(1)
        prefixes = [torch.cat([prefix, embedded], dim=1) for prefix in prefixes]
    expected = torch.stack(expected, dim=1)
    assert not torch.equal(expected, torch.stack(plain, dim=1))  # guidance changes some code here
    assert torch.equal(answer.codes, expected)


def test_logit_guidance_at_scale_zero_equals_no_guidance(tiny_model, tokens):
    prompts = [Prompt([Text([20 + i])], key=i, grid=(2, 2)) for i in range(2)]
    base = dict(steps=3, temperature=1.0, cfg_scale=0.0)
    unguided = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(**base))
    logits = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(**base, guidance="logits"))
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(unguided, logits, strict=True))
    with pytest.raises(ValueError, match="guidance='probs'"):
        ImageSamplingConfig(guidance="probs")


def test_dual_guidance_first_step(tiny_model, tokens):
    st, si = 1.5, 0.5
    grid = (2, 2)
    source = Media("image", torch.arange(16).reshape(4, 4) % 64, (2, 2))
    instruction = [30, 31]
    trace: list[StepTrace] = []
    generate_images(tiny_model, [Prompt([source, Text(instruction)], key=1, grid=grid)], tokens,
                    ImageSamplingConfig(steps=2, cfg_scale=0.0, text_scale=st, image_scale=si), trace=trace)
    cells = torch.tensor([2 + r * (grid[1] + 1) + c for r in range(grid[0]) for c in range(grid[1])])
    hidden = []
    for parts in ([source, Text(instruction)], [source, Text([tokens.uncondition])], [Text(instruction)]):
        head = layout_prompt(parts, tokens)
        seq = concat_pieces([head, layout_image_answer(grid, tokens, turn=1, start_position=len(head))], "x")
        hidden.append(_single_forward_rows(tiny_model, seq, cells + len(head)))
    h_c, h_ut, h_ui = hidden
    expected = h_c + st * (h_c - h_ut) + si * (h_c - h_ui)
    torch.testing.assert_close(trace[0].guided[0], expected, rtol=1e-4, atol=1e-4)


def _official_committed(n0: int, steps: int) -> list[int]:
    """Cells committed after each step under the official rule (generate_image_ar + mask_by_random_topk, no
    ties): keep_n = max(1, floor(n0 cos(pi/2 (k+1)/T))) in fp32 tensors (0 at the last step), of the L cells
    still masked at most L - 1 are masked again, and the loop ends once none is masked."""
    committed, masked = [], n0
    for k in range(steps):
        if masked == 0:
            break
        fraction = torch.cos(0.5 * math.pi * torch.tensor([(k + 1) / steps]))
        keep = 0 if k == steps - 1 else max(1, int((torch.tensor([float(n0)]) * fraction).floor()))
        masked = min(keep, masked - 1)
        committed.append(n0 - masked)
    return committed


@pytest.mark.parametrize("grid,steps", [((3, 4), 5), ((2, 2), 3), ((4, 4), 12), ((4, 4), 16), ((2, 2), 8)])
def test_committed_cells_follow_the_official_schedule(tiny_model, tokens, grid, steps):
    trace: list[StepTrace] = []
    prompts = [Prompt([Text([40, 41])], key=0, grid=grid), Prompt([Text([42])], key=1, grid=(1, 5))]
    answers = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(steps=steps, cfg_scale=1.0),
                              trace=trace)
    expected = [_official_committed(n0, steps) for n0 in (grid[0] * grid[1], 5)]
    assert len(trace) == max(len(e) for e in expected)  # stops once both prompts are done
    for p, committed in enumerate(expected):
        got = [t.committed[p] for t in trace]
        assert got[:len(committed)] == committed and set(got[len(committed):]) <= {committed[-1]}, p
        assert all(b > a for a, b in zip(committed, committed[1:], strict=False))  # every step commits one
    assert _official_committed(16, 12)[:3] == [1, 2, 3]  # the schedule alone would keep 15, 15, 14
    assert _official_committed(4, 3) == [1, 3, 4]  # fp32 cos(pi/3) < 0.5: floor(4 * 0.4999...) = 1
    for answer in answers:
        assert (answer.codes < 64).all() and (answer.codes >= 0).all()  # nothing left masked


def _fix_channel_head(model, favourite: list[int], strength: float = 8.0) -> None:
    """Make every channel-head output position the constant vector v (final adaLN scale -1, shift v) and
    lm_img_head[c] score code favourite[c] with |v|^2 = strength^2, every other code 0."""
    head = model.multi_codebook_head
    dim = head.condition_proj.weight.shape[0]
    v = torch.zeros(dim)
    v[0] = strength
    with torch.no_grad():
        final = head.channel_final.adaLN_modulation[1]
        final.weight.zero_()
        final.bias.zero_()
        final.bias[:dim] = -1.0  # scale chunk comes first: x * (1 + scale) = 0
        final.bias[dim:] = v  # shift
        for c, table in enumerate(model.lm_img_head):
            table.weight.zero_()
            table.weight[favourite[c]] = v


def test_fixed_heads_decode_the_favoured_codes(tiny_model, tokens):
    favourite = [5, 17, 63, 0]
    _fix_channel_head(tiny_model, favourite)
    prompts = [Prompt([Text([50])], key=0, grid=(2, 3)),
               Prompt([Media("image", torch.ones(4, 4, dtype=torch.long), (2, 2)), Text([51])], key=1, grid=(3, 2))]
    answers = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(steps=4, temperature=1.0))
    for answer, prompt in zip(answers, prompts, strict=True):
        assert answer.grid == prompt.grid
        expected = torch.tensor(favourite).expand(prompt.grid[0] * prompt.grid[1], -1)
        assert torch.equal(answer.codes, expected)


def test_first_step_sequence_is_the_training_layout_fully_masked(tiny_model, tokens):
    grid = (2, 3)
    source = Media("image", torch.arange(24).reshape(6, 4) % 64, (3, 2))
    codes = torch.randint(0, 64, (6, 4), generator=torch.Generator().manual_seed(0))
    sample = Sample("s", [Turn("user", [source, Text([60, 61, 62])]),
                          Turn("assistant", [Media("image", codes, grid)])])
    expected = layout_eval(sample, tokens, NoiseConfig(), seed=0, t=1.0)  # every cell masked
    seen = record_backbone_packs(tiny_model)
    generate_images(tiny_model, [Prompt([source, Text([60, 61, 62])], key=0, grid=grid)], tokens,
                    ImageSamplingConfig(steps=2, cfg_scale=0.0))
    first = seen[0]
    n = len(expected)
    assert first.seq_len == n  # no guidance branch at scale 0
    for name in ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean"):
        assert torch.equal(getattr(first, name)[0], getattr(expected, name)), name


def test_seeded_and_batch_independent(tiny_model, tokens):
    prompts = [Prompt([Text([20 + i])], key=i, grid=(2, 2)) for i in range(3)]
    config = ImageSamplingConfig(steps=3, cfg_scale=1.0, batch_size=3)
    together = generate_images(tiny_model, prompts, tokens, config)
    again = generate_images(tiny_model, prompts, tokens, config)
    one_by_one = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(steps=3, cfg_scale=1.0,
                                                                                  batch_size=1))
    other_seed = generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(steps=3, cfg_scale=1.0, seed=1))
    for a, b, c in zip(together, again, one_by_one, strict=True):
        assert torch.equal(a.codes, b.codes) and torch.equal(a.codes, c.codes)
    assert any(not torch.equal(a.codes, d.codes) for a, d in zip(together, other_seed, strict=True))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="cfg_scale"):
        ImageSamplingConfig(cfg_scale=1.0, text_scale=1.0)
    with pytest.raises(ValueError, match="steps"):
        ImageSamplingConfig(steps=0)


def test_image_prompt_needs_a_grid(tiny_model, tokens):
    with pytest.raises(ValueError, match="grid"):
        generate_images(tiny_model, [Prompt([Text([20])], key=0)], tokens, ImageSamplingConfig(steps=1))
    for bad in ((4,), (2, -1), (2, 0), (2.0, 3)):
        with pytest.raises(ValueError, match=rf"prompt 5: grid={re.escape(repr(bad))}"):
            generate_images(tiny_model, [Prompt([Text([20])], key=5, grid=bad)], tokens, ImageSamplingConfig(steps=1))


# sharpened codebook heads: per-codebook probabilities that rank cells differently under the mean than under
# the min, the product or one codebook alone (each of those fails one of the two cases)
@pytest.mark.parametrize("sharpness", [(40.0, 10.0, 3.0, 1.0), (10.0, 10.0, 10.0, 10.0)])
def test_remasking_keeps_the_least_confident_cells_by_mean_codebook_probability(tiny_model, tokens, sharpness):
    """Temperature 0, no guidance: each step samples every masked cell's C codes by argmax through the channel
    head, scores a cell by the mean of its C softmax probabilities, and masks again the keep_k least confident
    cells; the others keep their codes for good. Reference: a separate forward of each step's input and a
    naive argmax sampling function."""
    grid, steps = (3, 4), 4
    n0 = grid[0] * grid[1]
    keeps = [11, 8, 4, 0]  # floor(12 cos(k pi/8)) for k = 1, 2, 3; the last step 0
    with torch.no_grad():
        for table, factor in zip(tiny_model.lm_img_head, sharpness, strict=True):
            table.weight.mul_(factor)
    seen = record_backbone_packs(tiny_model)
    (answer,) = generate_images(tiny_model, [Prompt([Text([20, 21])], key=0, grid=grid)], tokens,
                                ImageSamplingConfig(steps=steps, temperature=0.0, cfg_scale=0.0, cache=False))
    del tiny_model.backbone
    head = len(layout_prompt([Text([20, 21])], tokens))
    cells = torch.tensor([head + 2 + r * (grid[1] + 1) + c for r in range(grid[0]) for c in range(grid[1])])

    def argmax_fn(logits, codebook):
        probs = torch.softmax(logits.double(), dim=-1)
        return probs.argmax(dim=-1), probs.max(dim=-1).values

    outcomes = [b.input_ids[0, cells] for b in seen[1:]] + [answer.codes]
    assert len(seen) == steps
    for step in range(steps):
        before = seen[step].input_ids[0, cells]  # [n0, C]
        masked = [i for i in range(n0) if (before[i] == tokens.image_mask).all()]
        assert len(masked) == (n0 if step == 0 else keeps[step - 1])
        with torch.no_grad():
            h = tiny_model.backbone(seen[step])[0, cells[masked]]
            codes, probs = tiny_model.multi_codebook_head.sample(h, argmax_fn, tiny_model.model.img_embeddings,
                                                                 tiny_model.lm_img_head)
        confidence = probs.mean(dim=1)
        least = sorted(range(len(masked)), key=lambda j: confidence[j].item())[:keeps[step]]
        expected = before.clone()
        for j, i in enumerate(masked):
            expected[i] = tokens.image_mask if j in least else codes[j]
        assert torch.equal(outcomes[step], expected), step


def test_identical_branches_guide_nothing(tiny_model, tokens):
    """A prompt that already is `<uncondition>` (no media): the negative branch equals the conditional one, so
    the guided state is h_c itself (contract 6.3), not (1 + s) h_c - s h_u with its rounding."""
    s, grid = 3.0, (2, 2)
    prompts = [Prompt([Text([tokens.uncondition])], key=0, grid=grid), Prompt([Text([20, 21])], key=1, grid=grid)]
    seen = record_backbone_packs(tiny_model)
    trace: list[StepTrace] = []
    generate_images(tiny_model, prompts, tokens, ImageSamplingConfig(steps=1, cfg_scale=s), trace=trace)
    del tiny_model.backbone
    with torch.no_grad():
        hidden = tiny_model.backbone(seen[0])[0]  # the same pack again: bitwise the sampler's hidden states
    # pack order: branch-major, [cond p0, cond p1, uncond p0, uncond p1]; a segment is its prompt + 10 answer
    # rows (BOA BOI, 2 x (2 cells, marker), EOI EOA); p1's negative prompt is p0's prompt
    lengths = [len(layout_prompt(p.parts, tokens)) for p in prompts] + [len(layout_prompt(prompts[0].parts,
                                                                                          tokens))] * 2
    starts = [sum(n + 10 for n in lengths[:i]) for i in range(4)]
    cells = torch.tensor([2 + r * 3 + c for r in range(2) for c in range(2)])
    h = [hidden[start + lengths[i] + cells] for i, start in enumerate(starts)]
    assert torch.equal(h[0], h[2])  # the two branches of prompt 0 really are the same
    assert torch.equal(trace[0].guided[0], h[0])
    torch.testing.assert_close(trace[0].guided[1], (1 + s) * h[1] - s * h[3], rtol=0, atol=0)


def test_remask_lowest_is_the_official_cut():
    """mask_by_random_topk: cut = the keep-th smallest score (keep clamped to L - 1), masked = score < cut."""
    from lumina.generation.sampling import remask_lowest

    score = torch.tensor([0.3, -1.0, 0.2, 0.9])
    assert remask_lowest(score, 2).tolist() == [False, True, True, False]
    assert remask_lowest(score, 9).tolist() == [True, True, True, False]  # at most L - 1
    assert remask_lowest(torch.tensor([0.1, 0.1, 0.5]), 1).tolist() == [False, False, False]  # ties stay
    assert remask_lowest(score, 0).tolist() == [False] * 4
