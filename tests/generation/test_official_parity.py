"""`lumina-generate` against the official generators (tests/generation/official/parity.json, written by
official/make_fixtures.py: generate_text_bd via infer_single_turn_text, generate_image_ar via
generate_single_image_sft's assembly) on the same tiny official-layout checkpoint, at temperature 0 and guidance
0: text-to-image at 8 and 16 steps on a 4 x 4 grid, understanding from 4- and 5-column .pt token files and a
.pkl of NumPy arrays, and text QA with a partial last block. Every output must be equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from official import cases
from official.interface import write_tiny_checkpoint

from lumina.generation.run import run

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


def _generate(checkpoint: Path, out: Path, overrides: list[str]) -> Path:
    from hydra import compose, initialize_config_dir

    from lumina.cli.train import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("generate", overrides=[f"checkpoint={checkpoint}", "device=cpu", "dtype=float32",
                                             f"text.seed={cases.PARITY_SEED}", f"image.seed={cases.PARITY_SEED}",
                                             *overrides])
    cfg.output_dir = str(out)
    return run(cfg)


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
