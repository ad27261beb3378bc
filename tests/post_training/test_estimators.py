"""The likelihood estimators against exact values computed step by step with the model (own code here)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from lumina.contract.schema import Text
from lumina.data.packing import collate_pack
from lumina.generation.image import generate_images
from lumina.generation.sampling_config import TextSamplingConfig
from lumina.generation.sequences import Prompt, image_sequence, prompt_piece, text_sequence
from lumina.generation.text import generate_text
from lumina.post_training.estimators import ESTIMATORS, build_estimator
from lumina.post_training.rollout import RolloutConfig, rollout, sample_key
from lumina.post_training.samples import Completion, RLPrompt
from lumina.post_training.scoring import score_views

TEMPERATURE = 0.8


def _image_completions(model, tokens, steps=4):
    prompts = [RLPrompt(Prompt([Text([20, 21, 22])], key="a", grid=(3, 3)), "t2i"),
               RLPrompt(Prompt([Text([23, 24])], key="b", grid=(2, 3)), "t2i")]
    config = RolloutConfig(group_size=2, temperature=TEMPERATURE, image_steps=steps, batch_size=3)
    return rollout(model, prompts, config, tokens, step=5), config


def _sampler_trace(model, tokens, completions, config, index):
    """The sampler's own trace of the chunk that holds completion `index` (rerun with the rollout's keys)."""
    start = index - index % config.batch_size
    chunk = completions[start:start + config.batch_size]
    keys = [sample_key(c.prompt.prompt.key, 5, j % config.group_size) for j, c in enumerate(chunk, start)]
    requests = [dataclasses.replace(c.prompt.prompt, key=k) for c, k in zip(chunk, keys, strict=True)]
    trace = []
    answers = generate_images(model, requests, tokens, config.image_sampling(len(chunk)), trace)
    assert torch.equal(answers[index - start].codes, completions[index].codes)
    return trace, index - start


def _brute_force_trajectory(model, tokens, completion: Completion, trace, k) -> float:
    """Step through the sampler's states: at step s, cells committed before s clean; draw (forced) the codes
    of the cells committed at s through the image head's own sampling path and add their log-probabilities.
    Each state's hidden rows at the masked cells must be the ones the sampler used at that step."""
    codes, when = completion.codes, completion.commit_step
    total = 0.0
    for step in range(int(when.max()) + 1):
        seq, rows = image_sequence(completion.prompt.prompt, tokens)
        clean = when < step
        seq.input_ids[rows[clean]] = codes[clean]
        batch = collate_pack([seq], len(seq), tokens.pad, tokens.num_codebooks)
        hidden = model.backbone(batch)[0]
        assert torch.allclose(hidden[rows[~clean]], trace[step].guided[k], atol=1e-5)
        now = (when == step).nonzero().squeeze(1)
        forced = codes[now]
        picked = []

        def force(logits, c, forced=forced, picked=picked):
            logp = torch.log_softmax(logits.double() / TEMPERATURE, dim=-1)
            picked.append(logp.gather(1, forced[:, c:c + 1]).squeeze(1))
            return forced[:, c], torch.ones(len(forced))

        model.sample_image_codes(hidden[rows[now]], force)
        total += float(torch.stack(picked).sum())
    return total


@torch.no_grad()
def test_trajectory_log_probability_equals_step_by_step_recomputation(tiny_model, tokens):
    completions, config = _image_completions(tiny_model, tokens)
    assert all(int(c.commit_step.max()) >= 2 for c in completions)  # several steps, so the replay is a path
    estimator = ESTIMATORS.build("trajectory", "estimator")
    got = score_views(tiny_model, completions, estimator.plan(completions, torch.Generator()), tokens,
                      TEMPERATURE, pack_tokens=64)
    want = torch.tensor([_brute_force_trajectory(tiny_model, tokens, c, *_sampler_trace(
        tiny_model, tokens, completions, config, i)) for i, c in enumerate(completions)])
    assert torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-4), (got, want)
    # the replayed path is the sampled one: G samples of a prompt differ, so their log-probs do too
    assert not torch.equal(completions[0].codes, completions[1].codes)


def _text_states(model, tokens, completion: Completion):
    """Each (block start, stop, step s, logits of the block's slots / T as log-probs) of the sampler's path:
    the block with the tokens committed before s clean, the rest masked, earlier blocks clean; no cache."""
    ids, when = torch.tensor(completion.ids), completion.commit_step
    piece = prompt_piece(completion.prompt.prompt, tokens)
    for block, (start, stop) in enumerate(completion.blocks()):
        for step in range(int(when[start:stop].max()) + 1):
            shown = torch.where(when[start:stop] < step, ids[start:stop], tokens.text_mask)
            seq, rows = text_sequence(piece, completion.ids[:start], shown, block, tokens, completion.block_length)
            hidden = model.backbone(collate_pack([seq], len(seq), tokens.pad, tokens.num_codebooks))[0]
            yield start, stop, step, model.heads().text_logits(hidden[rows]).double()


@torch.no_grad()
def test_text_commit_steps_are_the_samplers_path(tiny_model, tokens):
    """At temperature 0 every token is the argmax of the state its commit step names (3 slots in 3 steps: one
    a step)."""
    prompts = [Prompt([Text([20, 21, 22])], key="a"), Prompt([Text([23, 24])], key="b")]
    config = TextSamplingConfig(gen_length=6, block_length=3, steps=3, temperature=0.0, batch_size=2)
    for prompt, answer in zip(prompts, generate_text(tiny_model, prompts, tokens, config), strict=True):
        completion = Completion(RLPrompt(prompt, "text_qa"), 0, ids=answer.raw, block_length=3,
                                commit_step=torch.tensor(answer.commit_step))
        for start, stop, step, logits in _text_states(tiny_model, tokens, completion):
            assert sorted(answer.commit_step[start:stop]) == list(range(stop - start))
            now = completion.commit_step[start:stop] == step
            assert torch.equal(logits[now].argmax(-1), torch.tensor(answer.raw[start:stop])[now])


@torch.no_grad()
def test_trace_log_probability_equals_step_by_step_recomputation(tiny_model, tokens):
    prompts = [RLPrompt(Prompt([Text([20, 21, 22])], key="a"), "text_qa"),
               RLPrompt(Prompt([Text([23, 24])], key="b"), "text_qa")]
    config = RolloutConfig(group_size=2, temperature=TEMPERATURE, text_length=6, block_length=3, text_steps=3)
    completions = rollout(tiny_model, prompts, config, tokens, step=5)
    estimator = ESTIMATORS.build("trace", "estimator")
    got = score_views(tiny_model, completions, estimator.plan(completions, torch.Generator()), tokens,
                      TEMPERATURE, pack_tokens=64)
    want = []
    for c in completions:
        total = 0.0
        for start, stop, step, logits in _text_states(tiny_model, tokens, c):
            logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
            now = c.commit_step[start:stop] == step
            total += float(logp[now].gather(1, torch.tensor(c.ids[start:stop])[now, None]).sum())
        want.append(total)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5), (got, want)
    assert len({tuple(c.ids) for c in completions}) > 1  # sampled paths, not one greedy answer


def _three_token_completion(tokens, ids=(30, 31, 32)) -> Completion:
    return Completion(RLPrompt(Prompt([Text([40, 41, 42, 43])], key="q"), "text_qa"), 0, ids=list(ids),
                      block_length=4)


@torch.no_grad()
def _enumerated_elbo(model, tokens, completion: Completion) -> tuple[float, float]:
    """(ELBO, fully-masked sum): sum_{l=1..L} (1 / l) mean_{|M| = l} sum_{i in M} log p(x_i | x outside M),
    every mask set of the L-token answer, each state run through the backbone on its own."""
    ids = torch.tensor(completion.ids)
    n = len(ids)
    piece = prompt_piece(completion.prompt.prompt, tokens)
    elbo, full = 0.0, 0.0
    for size in range(1, n + 1):
        sets = list(itertools.combinations(range(n), size))
        mean = 0.0
        for chosen in sets:
            masked = torch.zeros(n, dtype=torch.bool)
            masked[list(chosen)] = True
            seq, rows = text_sequence(piece, [], torch.where(masked, tokens.text_mask, ids), 0, tokens, 4)
            hidden = model.backbone(collate_pack([seq], len(seq), tokens.pad, tokens.num_codebooks))[0]
            logp = torch.log_softmax(model.heads().text_logits(hidden[rows]).double() / TEMPERATURE, -1)
            value = float(logp[masked].gather(1, ids[masked, None]).sum())
            mean += value / len(sets)
            if size == n:
                full = value
        elbo += mean / size
    return elbo, full


@pytest.mark.parametrize("name", ["coupled", "blockwise"])
@torch.no_grad()
def test_mc_elbo_mean_matches_the_enumerated_elbo(tiny_model, tokens, name):
    completion = _three_token_completion(tokens)
    elbo, _ = _enumerated_elbo(tiny_model, tokens, completion)
    copies = [completion] * 400  # 400 independent draws of the estimator
    estimator = build_estimator({"name": name}, "estimator")
    draws = score_views(tiny_model, copies, estimator.plan(copies, torch.Generator().manual_seed(3)), tokens,
                        TEMPERATURE).double()
    mean, se = float(draws.mean()), float(draws.std() / math.sqrt(len(draws)))
    assert draws.std() > 0  # random masks: the draws vary
    assert abs(mean - elbo) < 3 * se, (name, mean, se, elbo)


@torch.no_grad()
def test_one_step_is_the_fully_masked_term(tiny_model, tokens):
    completion = _three_token_completion(tokens)
    _, full = _enumerated_elbo(tiny_model, tokens, completion)
    estimator = ESTIMATORS.build("one_step", "estimator")
    got = score_views(tiny_model, [completion], estimator.plan([completion], torch.Generator()), tokens,
                      TEMPERATURE)
    assert got.item() == pytest.approx(full, rel=1e-5)


@torch.no_grad()
def test_blocks_are_scored_with_the_earlier_blocks_clean(tiny_model, tokens):
    """A 2-block answer (block_length 2, 3 tokens): one_step = block 0 fully masked + block 1 fully masked
    after block 0 clean, each from the sampler's own layout."""
    completion = Completion(RLPrompt(Prompt([Text([40, 41])], key="r"), "text_qa"), 0, ids=[30, 31, 32],
                            block_length=2)
    piece = prompt_piece(completion.prompt.prompt, tokens)
    want = 0.0
    for block, (start, stop) in enumerate([(0, 2), (2, 3)]):
        ids = torch.tensor(completion.ids[start:stop])
        seq, rows = text_sequence(piece, completion.ids[:start], torch.full_like(ids, tokens.text_mask), block,
                                  tokens, 2)
        hidden = tiny_model.backbone(collate_pack([seq], len(seq), tokens.pad, tokens.num_codebooks))[0]
        logp = torch.log_softmax(tiny_model.heads().text_logits(hidden[rows]).double() / TEMPERATURE, -1)
        want += float(logp.gather(1, ids[:, None]).sum())
    views = ESTIMATORS.build("one_step", "e").plan([completion], torch.Generator())
    assert [v.block for v in views] == [0, 1]
    got = score_views(tiny_model, [completion], views, tokens, TEMPERATURE)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_scores_carry_gradients(tiny_model, tokens):
    completion = _three_token_completion(tokens)
    views = ESTIMATORS.build("coupled", "e").plan([completion], torch.Generator().manual_seed(0))
    score_views(tiny_model, [completion], views, tokens).sum().backward()
    assert tiny_model.lm_head.weight.grad is not None and tiny_model.lm_head.weight.grad.abs().sum() > 0


def test_estimator_refuses_the_other_modality(tiny_model, tokens):
    completion = _three_token_completion(tokens)
    with pytest.raises(ValueError, match="Trajectory scores image answers"):
        ESTIMATORS.build("trajectory", "e").plan([completion], torch.Generator())
    with pytest.raises(ValueError, match="estimator.name='nope'"):
        build_estimator("nope", "estimator")
    with pytest.raises(ValueError, match="draws=0"):
        build_estimator({"name": "coupled", "draws": 0}, "estimator")
