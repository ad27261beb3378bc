"""The samplers' key/value cache (`lumina.attention.KVCache`, `cache=true`) against the full forward
(`cache=false`) on the real tiny MoE model in fp32: every task, guidance kind and decoding mode gives the same
tokens / codes from logits within 1e-5; the cache holds exactly the rows the rule makes final; MoE layers route
only the rows a forward computes; the budget refuses; a rule without final rows warns and still agrees."""

from __future__ import annotations

import logging

import pytest
import torch
from gen_helpers import compare_decisions, record_decisions

from lumina.attention import AttentionRule, KVCache, build_spec
from lumina.contract.schema import Media, Text
from lumina.data.packing import collate_pack
from lumina.generation import ImageSamplingConfig, Prompt, TextSamplingConfig, generate_images, generate_text
from lumina.generation.sequences import image_sequence, prompt_piece, text_sequence


def _image(seed: int, grid: tuple[int, int]) -> Media:
    g = torch.Generator().manual_seed(seed)
    return Media("image", torch.randint(0, 64, (grid[0] * grid[1], 4), generator=g), grid)


def text_prompts() -> list[Prompt]:
    """Understanding (with a system prompt) and text QA, of different lengths."""
    return [Prompt([_image(1, (3, 3)), Text([40, 41, 42])], system=[15, 16], key="understand"),
            Prompt([Text([20, 21, 22, 23, 24, 25, 26])], key="text_qa"),
            Prompt([_image(2, (2, 4)), Text([50])], key="understand_2")]


def image_prompts() -> list[Prompt]:
    """Text-to-image and editing (a source image in the prompt), of different lengths."""
    return [Prompt([Text([20, 21, 22])], key="t2i", grid=(3, 3)),
            Prompt([_image(3, (2, 3)), Text([30, 31])], key="edit", grid=(2, 3)),
            Prompt([Text([23])], key="t2i_2", grid=(2, 2))]


TEXT_CASES = {
    "fixed_steps": dict(gen_length=20, block_length=8, steps=4),  # a partial last block
    "more_steps_than_slots": dict(gen_length=12, block_length=4, steps=6),
    "threshold": dict(gen_length=16, block_length=8, steps=8, threshold=0.004),
}
IMAGE_CASES = {
    "none": dict(steps=4, cfg_scale=0.0),
    "single": dict(steps=4, cfg_scale=2.0),
    "dual": dict(steps=4, cfg_scale=0.0, text_scale=1.5, image_scale=1.2),
    "logits": dict(steps=4, cfg_scale=2.0, guidance="logits"),
}
NEAR_TIES = 0  # reference decisions with a margin under 1e-5 in these cases


def _both(run):
    """run(cache) twice, recording decisions -> (answers by cache, near ties of the reference run)."""
    answers, decisions = {}, {}
    for cache in (False, True):
        with record_decisions() as decisions[cache]:
            answers[cache] = run(cache)
    return answers, compare_decisions(decisions[False], decisions[True])


@pytest.mark.parametrize("case", sorted(TEXT_CASES))
def test_text_with_the_cache_equals_the_full_forward(case, tiny_model, tokens):
    def run(cache):
        config = TextSamplingConfig(**TEXT_CASES[case], temperature=0.0, batch_size=2, cache=cache)
        return generate_text(tiny_model, text_prompts(), tokens, config)

    answers, near_ties = _both(run)
    assert [a.raw for a in answers[True]] == [a.raw for a in answers[False]]
    assert near_ties == NEAR_TIES


@pytest.mark.parametrize("case", sorted(IMAGE_CASES))
def test_images_with_the_cache_equal_the_full_forward(case, tiny_model, tokens):
    def run(cache):
        config = ImageSamplingConfig(**IMAGE_CASES[case], temperature=0.0, batch_size=2, cache=cache)
        return generate_images(tiny_model, image_prompts(), tokens, config)

    answers, near_ties = _both(run)
    for got, ref in zip(answers[True], answers[False], strict=True):
        assert torch.equal(got.codes, ref.codes)
    assert near_ties == NEAR_TIES


def test_same_seed_same_samples_above_temperature_zero(tiny_model, tokens):
    """Sampled with Gumbel noise (and top-k / top-p), the cache gives the same samples as the full forward, from
    logits within 1e-5 (the samples alone would not notice a 0.1% error in the hidden states)."""
    def text(cache, seed=5):
        config = TextSamplingConfig(gen_length=16, block_length=8, steps=4, temperature=1.0, top_k=50, top_p=0.9,
                                    seed=seed, cache=cache)
        return [a.raw for a in generate_text(tiny_model, text_prompts(), tokens, config)]

    def image(cache, seed=5):
        config = ImageSamplingConfig(steps=4, temperature=1.0, cfg_scale=2.0, seed=seed, cache=cache)
        return [a.codes for a in generate_images(tiny_model, image_prompts(), tokens, config)]

    texts, _ = _both(text)
    assert texts[True] == texts[False] != text(True, seed=6)
    images, _ = _both(image)
    assert all(torch.equal(a, b) for a, b in zip(images[True], images[False], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(images[True], image(True, seed=6), strict=True))


def test_batched_prompts_with_the_cache_equal_one_at_a_time(tiny_model, tokens):
    """Prompts of different lengths packed `batch_size` per forward, each with its own cache."""
    def run(batch_size):
        config = TextSamplingConfig(gen_length=16, block_length=8, steps=4, batch_size=batch_size)
        return [a.raw for a in generate_text(tiny_model, text_prompts(), tokens, config)]

    assert run(3) == run(1)


# ---- what the cache holds and computes ----

def test_the_cache_holds_exactly_the_final_rows_and_each_forward_computes_the_rest(tiny_model, tokens):
    """Text decoding at block 2 then block 3 of one prompt, and an edit's image step: the held rows are the
    rule's final rows, a later forward computes only the others, and its hidden states equal the full
    forward's at those rows."""
    piece = prompt_piece(text_prompts()[0], tokens)
    mask = torch.full((4,), tokens.text_mask, dtype=torch.long)
    now, _ = text_sequence(piece, list(range(100, 108)), mask, 2, tokens, 4)
    later, rows = text_sequence(piece, list(range(100, 112)), mask, 3, tokens, 4)
    edit, _ = image_sequence(image_prompts()[1], tokens)
    cache = KVCache()
    with torch.no_grad():
        for sequences in ([now, edit], [later, edit]):
            pack = collate_pack(sequences, sum(len(s) for s in sequences), tokens.pad, tokens.num_codebooks)
            held_before = {name: h.size for name, h in cache.held.items()}
            step = cache.step(pack, ["text", "edit"])
            assert step.rows.numel() == pack.seq_len - sum(held_before.values())
            hidden = tiny_model.backbone(step.queries, step)[0]
            full = tiny_model.backbone(pack)[0]
            torch.testing.assert_close(hidden, full[step.rows], atol=1e-5, rtol=0)
            final = build_spec(pack, rule=tiny_model.config.attn_rule).final_rows()[0]
            bounds = pack.seg_bounds
            for name, start, end in zip(["text", "edit"], bounds[:-1], bounds[1:], strict=True):
                held = cache.held[name]
                expected = final[start:end].nonzero().squeeze(1)
                assert torch.equal(torch.sort(held.positions).values, expected)
                assert all(t.shape[2] == expected.numel() for t in (*held.keys, *held.values))
                assert len(held.keys) == tiny_model.config.num_hidden_layers
    # text: prompt, BOA and the three committed blocks; the edit: its prompt with the source image only
    assert cache.held["text"].size == len(piece) + 1 + 12
    assert cache.held["edit"].size == len(prompt_piece(image_prompts()[1], tokens))
    assert held_before == {"text": len(piece) + 1 + 8, "edit": len(prompt_piece(image_prompts()[1], tokens))}


def test_moe_layers_route_only_the_rows_a_forward_computes(tiny_model, tokens):
    """The first forward routes the whole pack; every later one only the answer rows (the prompt is held)."""
    routed = []
    router = tiny_model.moe_layers()[0].gate
    handle = router.register_forward_hook(lambda module, args, out: routed.append(args[0].shape[0]))
    prompt = image_prompts()[1]
    sequence, cells = image_sequence(prompt, tokens)
    try:
        generate_images(tiny_model, [prompt], tokens, ImageSamplingConfig(steps=3, cfg_scale=0.0, temperature=0.0))
        with_cache, routed[:] = list(routed), []
        generate_images(tiny_model, [prompt], tokens,
                        ImageSamplingConfig(steps=3, cfg_scale=0.0, temperature=0.0, cache=False))
    finally:
        handle.remove()
    prompt_rows = len(prompt_piece(prompt, tokens))
    assert routed == [len(sequence)] * 3
    assert with_cache == [len(sequence)] + [len(sequence) - prompt_rows] * 2


def test_a_held_row_that_changes_is_refused(tiny_model, tokens):
    sequence, _ = image_sequence(image_prompts()[0], tokens)
    pack = collate_pack([sequence], len(sequence), tokens.pad, tokens.num_codebooks)
    cache = KVCache()
    with torch.no_grad():
        step = cache.step(pack, ["a"])
        tiny_model.backbone(step.queries, step)
        pack.input_ids[0, 3] += 1  # a prompt row, held
        with pytest.raises(ValueError, match="a held row's ids or metadata changed"):
            cache.step(pack, ["a"])
        shorter = prompt_piece(Prompt([Text([])]), tokens)  # fewer rows than the held prompt
        short = collate_pack([shorter], len(shorter), tokens.pad, tokens.num_codebooks)
        held = len(prompt_piece(image_prompts()[0], tokens))
        with pytest.raises(ValueError, match=f"segment 'a' holds row {held - 1}, but the pack gives it "
                                             f"{len(shorter)} rows"):
            cache.step(short, ["a"])


# ---- budget, rules without final rows, settings ----

def test_the_budget_refuses_a_prompt_naming_the_setting(tiny_model, tokens):
    config = TextSamplingConfig(gen_length=16, block_length=8, steps=4, cache_budget_gib=1e-6)
    with pytest.raises(ValueError, match=r"prompt 'text_qa': its key/value cache .* over cache_budget_gib=1e-06"):
        generate_text(tiny_model, text_prompts()[1:2], tokens, config)
    generate_text(tiny_model, text_prompts()[1:2], tokens,
                  TextSamplingConfig(gen_length=16, block_length=8, steps=4, cache_budget_gib=1e-6, cache=False))
    # the t2i prompt's two branches may hold 22 rows of 768 bytes (3 layers x k, v x 2 heads x 16 x fp32), the
    # edit prompt 30 more: it no longer fits
    with pytest.raises(ValueError, match=r"prompt 'edit': .* \(30 rows x 768 bytes\) takes this batch's caches to 3.72e-05 GiB"):
        generate_images(tiny_model, image_prompts()[:2], tokens,
                        ImageSamplingConfig(steps=2, cfg_scale=2.0, cache_budget_gib=22 * 768 / 2**30))
    generate_images(tiny_model, image_prompts()[:1], tokens,
                    ImageSamplingConfig(steps=2, cfg_scale=2.0, cache_budget_gib=22 * 768 / 2**30))


def test_the_cache_size_is_logged(tiny_model, tokens, caplog):
    with caplog.at_level(logging.INFO, logger="lumina.generation.cache"):
        generate_images(tiny_model, image_prompts()[:1], tokens, ImageSamplingConfig(steps=2, cfg_scale=2.0))
    (line,) = [r.getMessage() for r in caplog.records if "key/value cache" in r.getMessage()]
    # the prompt rows (turn 0) of the conditional and the <uncondition> branch
    rows = sum(int((image_sequence(image_prompts()[0], tokens, drop, drop)[0].turn_ids == 0).sum())
               for drop in (False, True))
    per_row = 2 * 3 * 2 * 16 * 4  # k and v, 3 layers, 2 kv heads, head_dim 16, fp32
    assert f"peak {rows * per_row / 2**30:.4f} GiB (torch.float32), {rows} rows" in line


class NothingFinal(AttentionRule):
    """The full rules' pairs, but no final row reported (the protocol's default)."""

    def allow(self, q, k):
        from lumina.attention.rules.full import FullRules
        return FullRules().allow(q, k)


@pytest.mark.parametrize("rule", ["simple", f"{__name__}.NothingFinal"])
def test_a_rule_with_fewer_final_rows_warns_once_and_agrees(rule, tokens, caplog):
    """simple: only the prompt is final, the committed blocks run every step; a rule reporting no final row
    runs the full forward. Both warn once and give the full forward's answers."""
    from lumina.model import LuminaModel
    from lumina.model.config import LuminaConfig

    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(attn_rule=rule)).eval()
    import lumina.generation.cache as cache_mod
    cache_mod._WARNED.discard(rule)
    with caplog.at_level(logging.WARNING, logger="lumina.generation.cache"):
        answers, near_ties = _both(lambda cache: [a.raw for a in generate_text(
            model, text_prompts(), tokens, TextSamplingConfig(gen_length=16, block_length=8, steps=4, cache=cache))])
    assert answers[True] == answers[False] and near_ties == 0
    warnings = [r.getMessage() for r in caplog.records if "cannot hold them" in r.getMessage()]
    assert len(warnings) == 1 and f"attn_rule={rule}" in warnings[0]


def test_cache_settings_are_checked():
    with pytest.raises(ValueError, match="TextSamplingConfig.cache='yes': must be true or false"):
        TextSamplingConfig(cache="yes")
    with pytest.raises(ValueError, match="ImageSamplingConfig.cache_budget_gib=0: must be a positive number"):
        ImageSamplingConfig(cache_budget_gib=0)


def test_the_dense_reference_backend_serves_the_cache_too(tokens):
    """sdpa_dense (one masked [Lq, Lk] call) with the cache gives the segmented backend's answers."""
    from lumina.model import LuminaModel
    from lumina.model.config import LuminaConfig

    answers = {}
    for backend in ("segmented", "sdpa_dense"):
        torch.manual_seed(0)
        model = LuminaModel(LuminaConfig.tiny(attn_backend=backend)).eval()
        answers[backend] = [a.raw for a in generate_text(model, text_prompts(), tokens, TextSamplingConfig(
            gen_length=16, block_length=8, steps=4, temperature=0.0))]
    assert answers["sdpa_dense"] == answers["segmented"]
