"""lumina's sequences against the official inference scripts' (tests/generation/official/sequences.json, written
by official/make_fixtures.py from InternLM/InternLumina-U2's builders): token for token, with type ids and the
clean / turn / block / position metadata, for understanding (image, two images, placeholder in mid-text, a later
turn, video, 3-D), text QA, text-to-image and editing with its single and dual guidance negatives. Training
(`layout_eval` / `layout_sample`), generation (`Prompt` + the sampler's builders) and `lumina-generate`'s prompt
construction are each checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from official import cases
from omegaconf import OmegaConf

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import layout_eval, layout_sample
from lumina.generation.assets import GenerationAssets
from lumina.generation.run import _prompt
from lumina.generation.sequences import Prompt, image_sequence, prompt_piece, text_sequence
from lumina.generation.settings import SETTINGS_DIR
from lumina.tokenizers.text import HFTokenizer, special_tokens_of

EXPECTED = json.loads((Path(__file__).parent / "official" / "sequences.json").read_text())
SYSTEM = EXPECTED.pop("system_prompts")  # the official scripts' defaults


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> HFTokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    cases.fixture_tokenizer(SYSTEM).save(str(path))
    return HFTokenizer(path)


@pytest.fixture(scope="module")
def tokens(tok):
    return special_tokens_of(tok, codebook_size=4096, num_codebooks=8)


def image(seed: int = 1) -> Media:
    h, w = cases.IMAGE_GRID
    return Media("image", cases.codes(h * w, seed), cases.IMAGE_GRID)


VIDEO = Media("video", cases.codes(8, 2), cases.VIDEO_GRID)
MESH = Media("mesh3d", cases.codes(8, 3), cases.MESH_GRID)


def assert_rows(seq, expected: dict, rows: slice | torch.Tensor = slice(None)) -> None:
    assert seq.input_ids[rows].tolist() == expected["input_ids"]
    assert seq.type_ids[rows].tolist() == expected["type_ids"]
    for name in ("turn_ids", "block_ids", "position_ids"):
        if name in expected:
            assert getattr(seq, name)[rows].tolist() == expected[name], name
    if "is_clean" in expected:
        assert seq.is_clean[rows].long().tolist() == expected["is_clean"]


UNDERSTANDING = {  # case -> (system key, user parts as a manifest gives them)
    "understand_image": ("understand", lambda enc: [image(), Text(enc(cases.USER["understand_image"]))]),
    "understand_two_images": ("understand", lambda enc: [image(), image(4),
                                                         Text(enc(cases.USER["understand_two_images"]))]),
    "understand_mid_text": ("understand", lambda enc: [Text(enc(cases.USER["understand_mid_text"])), image()]),
    "understand_video": ("understand_video", lambda enc: [VIDEO, Text(enc(cases.USER["understand_video"]))]),
    "understand_mesh3d": ("understand_mesh3d", lambda enc: [MESH, Text(enc(cases.USER["understand_mesh3d"]))]),
    "text_qa": ("text", lambda enc: [Text(enc(cases.USER["text_qa"]))]),
}


@pytest.mark.parametrize("case", sorted(UNDERSTANDING))
def test_text_answer_prompts_match_the_official_builders(case, tok, tokens):
    """Prompt + BOA rows of the sampler's first block, and of the training layout, equal the official prefix
    (build_sft_*_prefix + _append_boa_with_meta); the first answer slot sits at generated_position_start."""
    key, parts = UNDERSTANDING[case]
    expected = EXPECTED[case]
    system = tok.encode(SYSTEM[key])
    n = len(expected["input_ids"])  # prompt + BOA
    prompt = Prompt(parts(tok.encode), system=system)
    mask = torch.full((32,), tokens.text_mask, dtype=torch.long)
    seq, block_rows = text_sequence(prompt_piece(prompt, tokens), [], mask, 0, tokens, 32)
    assert_rows(seq, expected, slice(0, n))
    assert seq.position_ids[block_rows[0]] == expected["generated_position_start"]
    assert seq.block_ids[block_rows].tolist() == [0] * 32 and not seq.is_clean[block_rows].any()
    sample = Sample(case, [Turn("system", [Text(system)]), Turn("user", parts(tok.encode)),
                           Turn("assistant", [Text(tok.encode("two"))])])
    trained = layout_eval(sample, tokens, NoiseConfig(block_length=32), seed=0, t=1.0)
    assert_rows(trained, expected, slice(0, n))


def test_a_later_turn_matches_the_official_builder(tok, tokens):
    """The second user turn of a conversation (build_sft_user_prefix(first_user=False)): no system, its image
    on its own line."""
    enc = tok.encode
    sample = Sample("multi", [Turn("system", [Text(enc(SYSTEM["understand"]))]),
                              Turn("user", [image(), Text(enc(cases.USER["understand_image"]))]),
                              Turn("assistant", [Text(enc("red"))]),
                              Turn("user", [image(4), Text(enc(cases.USER["understand_later_turn"]))]),
                              Turn("assistant", [Text(enc("green"))])])
    seq = layout_eval(sample, tokens, NoiseConfig(block_length=32), seed=0, t=1.0)
    later = (seq.turn_ids == 2).nonzero().squeeze(1)
    assert_rows(seq, EXPECTED["understand_later_turn"], later)
    assert seq.is_clean[later].all() and (seq.block_ids[later] == -1).all()


IMAGE_BRANCHES = {"cond": (False, False), "uncond": (True, True), "uncond_text": (True, False),
                  "uncond_image": (False, True)}


def _image_prompt(case: str, tok) -> Prompt:
    parts = [Text(tok.encode(cases.USER[case]))]
    if case == "edit":
        parts.insert(0, image())
    grid = cases.IMAGE_GRID if case == "edit" else cases.T2I_GRID
    return Prompt(parts, system=tok.encode(SYSTEM[case]), grid=grid)


def _check_branches(case: str, prompt: Prompt, tokens) -> None:
    for branch, expected in EXPECTED[case].items():
        seq, _ = image_sequence(prompt, tokens, *IMAGE_BRANCHES[branch])
        assert_rows(seq, expected)
        p = expected["user_prefix_len"]
        assert seq.is_clean[:p].all() and not seq.is_clean[p:].any(), branch  # clean turn 0 | noisy image turn
        assert (seq.turn_ids[:p] == 0).all() and (seq.turn_ids[p:] == 1).all(), branch
        assert seq.position_ids.tolist() == list(range(len(seq))), branch


@pytest.mark.parametrize("case", ["t2i", "edit"])
def test_image_answer_branches_match_the_official_builders(case, tok, tokens):
    """Conditional branch, the single-guidance negative, and for editing the dual-guidance text / image
    negatives (generate_single_image_sft, build_sft_uncondition_prefix, build_sft_edit_dual_cfg_prefixes)."""
    assert set(EXPECTED[case]) == ({"cond", "uncond", "uncond_text", "uncond_image"} if case == "edit"
                                   else {"cond", "uncond"})
    _check_branches(case, _image_prompt(case, tok), tokens)


@pytest.mark.parametrize("drop_text, drop_image, branch", [(True, False, "uncond_text"),
                                                          (False, True, "uncond_image"), (True, True, "uncond")])
def test_training_cfg_dropout_is_the_official_negative(drop_text, drop_image, branch, tok, tokens):
    """An edit sample's CFG dropout lays out the prompt of the matching official guidance branch."""
    enc = tok.encode
    sample = Sample("edit", [Turn("system", [Text(enc(SYSTEM["edit"]))]),
                             Turn("user", [image(), Text(enc(cases.USER["edit"]))]),
                             Turn("assistant", [image(5)])])
    noise = NoiseConfig(uncond_text_prob=float(drop_text), uncond_image_prob=float(drop_image))
    seq = layout_sample(sample, tokens, noise, seed=0, epoch=0)
    expected = EXPECTED["edit"][branch]
    p = expected["user_prefix_len"]
    assert seq.input_ids[:p].tolist() == expected["input_ids"][:p]
    assert seq.type_ids[:p].tolist() == expected["type_ids"][:p]


@pytest.mark.parametrize("case", ["t2i", "edit", "understand_image", "understand_mid_text", "text_qa"])
def test_lumina_generate_builds_the_official_request(case, tok, tokens, tmp_path):
    """`lumina-generate`'s prompt construction from a prompt string (and a 5-column token file), with its own
    copy of the official system prompts (conf/generate/official.yaml -> lumina.contract.system_prompts), equals the
    official sequence."""
    assets = GenerationAssets(tok, tokens, None, "fixture")
    settings = OmegaConf.load(SETTINGS_DIR / "official.yaml")
    h, w = cases.IMAGE_GRID
    source = tmp_path / "image.pt"
    torch.save({"indices": cases.codes(h * w, 1),
                "coords": torch.tensor([[0, 0, r, c, 0] for r in range(h) for c in range(w)])}, source)
    with_image = case not in ("t2i", "text_qa")
    task = {"t2i": "t2i", "edit": "edit", "text_qa": "text"}.get(case, "understand")
    cfg = OmegaConf.create({"system": None, "grid": list(cases.T2I_GRID) if case == "t2i" else None})
    request = {"prompt": cases.USER[case], "image": str(source) if with_image else None}
    prompt = _prompt(0, request, assets, cfg, settings, task)
    if task in ("t2i", "edit"):
        _check_branches(case, prompt, tokens)
        return
    expected = EXPECTED[case]
    mask = torch.full((4,), tokens.text_mask, dtype=torch.long)
    seq, _ = text_sequence(prompt_piece(prompt, tokens), [], mask, 0, tokens, 4)
    assert_rows(seq, expected, slice(0, len(expected["input_ids"])))
