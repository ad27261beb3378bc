"""`lumina-generate` against the official generators (tests/generation/official/parity.json, written by
official/make_fixtures.py: generate_text_bd via infer_single_turn_text and via infer_video_sft's call,
generate_image_ar via generate_single_image_sft's assembly) on the same tiny official-layout checkpoint, at
temperature 0: text-to-image at 8 and 16 steps on a 4 x 4 grid without guidance and with cfg 3; editing a token
file image with single and with dual guidance; understanding from 4- and 5-column .pt token files, a .pkl of
NumPy arrays and a second, different image; text QA with a partial last block; and video understanding from an
official video token file (through lumina's text sampler: `lumina-generate` takes no video input). Every output
must be equal, with lumina's key/value cache (the default) and without it (`cache=false`): the two runs also
make the same decisions from logits within 1e-5, and no decision of the reference run is a near tie (margin
under 1e-5: NEAR_TIES per case, 0 in every case)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gen_helpers import compare_decisions, record_decisions
from official import cases
from official.interface import write_tiny_checkpoint

from lumina.contract.schema import Media, Text
from lumina.generation.assets import load_model
from lumina.generation.run import run
from lumina.generation.sampling_config import TextSamplingConfig
from lumina.generation.sequences import Prompt
from lumina.generation.text import generate_text
from lumina.tokenizers.text import HFTokenizer, special_tokens_of
from lumina.tokenizers.token_files import read_token_file

EXPECTED = json.loads((Path(__file__).parent / "official" / "parity.json").read_text())
SYSTEM = json.loads((Path(__file__).parent / "official" / "sequences.json").read_text())["system_prompts"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("official") / "ckpt")
    cases.fixture_tokenizer(SYSTEM).save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> dict:
    return cases.write_token_files(tmp_path_factory.mktemp("tokens"))


NEAR_TIES = 0  # reference decisions with a margin under 1e-5, in every case


def _generate(checkpoint: Path, out: Path, overrides: list[str]) -> Path:
    """lumina-generate with the cache and without; both write the same files. -> the cached run's folder."""
    from hydra import compose, initialize_config_dir

    from lumina.cli.train import CONF_DIR

    decisions, folders = {}, {}
    for cache in (False, True):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("generate", overrides=[f"checkpoint={checkpoint}", "device=cpu", "dtype=float32",
                                                 f"text.seed={cases.PARITY_SEED}", f"image.seed={cases.PARITY_SEED}",
                                                 f"cache={str(cache).lower()}", *overrides])
        cfg.output_dir = str(out / f"cache_{cache}")
        with record_decisions() as decisions[cache]:
            folders[cache] = run(cfg)
    assert compare_decisions(decisions[False], decisions[True]) == NEAR_TIES
    outputs = sorted(p.name for p in folders[False].iterdir() if p.suffix in (".jsonl", ".pt"))
    assert outputs and outputs == sorted(p.name for p in folders[True].iterdir() if p.suffix in (".jsonl", ".pt"))
    for name in outputs:
        if name.endswith(".pt"):
            assert torch.equal(torch.load(folders[True] / name)["indices"], torch.load(folders[False] / name)["indices"])
        else:
            assert (folders[True] / name).read_text() == (folders[False] / name).read_text()
    return folders[True]


def _answer_ids(out: Path) -> list[int]:
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    return line["ids"]


def _text_settings(settings: dict) -> list[str]:
    return [f"text.{k}={v}" for k, v in settings.items()] + ["text.temperature=0.0"]


@pytest.mark.parametrize("name", ["coords4.pt", "coords5.pt", "numpy.pkl"])
def test_understanding_from_token_files(name, checkpoint, token_files, tmp_path):
    out = _generate(checkpoint, tmp_path, ["task=understand", f"prompts=[{json.dumps(cases.USER['understand_image'])}]",
                                           f"images=[{token_files[name]}]", *_text_settings(cases.PARITY_UNDERSTAND)])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["ids"] == EXPECTED[f"understand_{name}"]["ids"]


def test_text_qa_with_a_partial_last_block(checkpoint, tmp_path):
    out = _generate(checkpoint, tmp_path, ["task=text", f"prompts=[{json.dumps(cases.USER['text_qa'])}]",
                                           *_text_settings(cases.PARITY_TEXT)])
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    expected = EXPECTED["text_qa_partial_block"]["ids"]
    assert len(expected) <= cases.PARITY_TEXT["gen_length"] < 16  # 12 slots, not two whole blocks of 8
    assert line["ids"] == expected


@pytest.mark.parametrize("name", sorted(cases.PARITY_T2I))
def test_text_to_image(name, checkpoint, tmp_path):
    h, w = cases.PARITY_T2I_GRID
    out = _generate(checkpoint, tmp_path, ["task=t2i", f"prompts=[{json.dumps(cases.USER['t2i'])}]", f"grid=[{h},{w}]",
                                           f"image.steps={cases.PARITY_T2I[name]}", "image.cfg_scale=0.0",
                                           "image.temperature=0.0"])
    codes = torch.load(out / "code_0.pt")["indices"]
    assert codes.tolist() == EXPECTED[name]["codes"]


def test_understanding_a_second_image(checkpoint, tmp_path):
    first, second = EXPECTED["understand_coords4.pt"]["ids"], EXPECTED["understand_second_image"]["ids"]
    assert first != second  # the official answer depends on the image
    path = cases.write_second_image(tmp_path)
    out = _generate(checkpoint, tmp_path / "out", ["task=understand",
                                                   f"prompts=[{json.dumps(cases.USER['understand_image'])}]",
                                                   f"images=[{path}]", *_text_settings(cases.PARITY_UNDERSTAND)])
    assert _answer_ids(out) == second


def test_video_understanding_from_a_token_file(checkpoint, tmp_path):
    """The official video token file (frames last first, cells in (x, y) order) read by lumina's reader, answered by
    `generate_text` (what lumina-generate runs for understanding) with the official video system prompt."""
    tok = HFTokenizer(checkpoint / "tokenizer.json")
    tokens = special_tokens_of(tok, codebook_size=4096, num_codebooks=8)
    found = read_token_file(cases.write_video_file(tmp_path), "video")
    assert found.grid == cases.VIDEO_GRID
    prompt = Prompt([Media("video", found.codes, found.grid), Text(tok.encode(cases.USER["understand_video"]))],
                    system=tok.encode(SYSTEM["understand_video"]))
    model = load_model(checkpoint, device="cpu", dtype="float32")
    answers, decisions = {}, {}
    for cache in (False, True):
        config = TextSamplingConfig(**cases.PARITY_UNDERSTAND, temperature=0.0, seed=cases.PARITY_SEED, cache=cache)
        with record_decisions() as decisions[cache]:
            (answers[cache],) = generate_text(model, [prompt], tokens, config)
        assert answers[cache].ids == EXPECTED["understand_video_file"]["ids"]
    assert compare_decisions(decisions[False], decisions[True]) == NEAR_TIES


@pytest.mark.parametrize("name", sorted(cases.PARITY_GUIDED))
def test_guided_image_answers(name, checkpoint, token_files, tmp_path):
    guidance = cases.PARITY_GUIDED[name]
    scales = [f"image.cfg_scale={guidance['cfg_scale']}", f"image.text_scale={guidance.get('cfg_text', 0.0)}",
              f"image.image_scale={guidance.get('cfg_img', 0.0)}"]
    if name.startswith("t2i"):
        h, w = cases.PARITY_T2I_GRID
        task = ["task=t2i", f"prompts=[{json.dumps(cases.USER['t2i'])}]", f"grid=[{h},{w}]"]
    else:  # the answer takes the source's grid
        task = ["task=edit", f"prompts=[{json.dumps(cases.USER['edit'])}]", f"images=[{token_files['coords4.pt']}]"]
    out = _generate(checkpoint, tmp_path, [*task, f"image.steps={cases.PARITY_GUIDED_STEPS}", *scales,
                                           "image.temperature=0.0"])
    codes = torch.load(out / "code_0.pt")["indices"]
    assert codes.tolist() == EXPECTED[name]["codes"]
