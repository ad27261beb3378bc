"""Fixtures for the checkpoint tests: tiny config, seeded fp32/bf16 tiny models, a release-like source dir."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoint_helpers import seeded_model

from lumina.model import LuminaConfig, LuminaModel


@pytest.fixture(scope="module")
def tiny_config() -> LuminaConfig:
    return LuminaConfig.tiny()


@pytest.fixture(scope="module")
def fp32_model(tiny_config: LuminaConfig) -> LuminaModel:
    return seeded_model(tiny_config, seed=0)


@pytest.fixture(scope="module")
def bf16_model(tiny_config: LuminaConfig) -> LuminaModel:
    return seeded_model(tiny_config, seed=1, dtype=torch.bfloat16)


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    """A source directory with the non-weight files an official release ships."""
    src = tmp_path / "release"
    src.mkdir()
    files = {"tokenizer.json": '{"version": "1.0"}', "tokenizer_config.json": '{"pad_token": "<pad>"}',
             "special_tokens_map.json": "{}", "merges.txt": "a b\n", "vocab.json": '{"a": 0}',
             "modeling_internluminau2.py": "# model code\n", "configuration_internluminau2.py": "# config\n",
             "tokenbridge.py": "# bridge\n", "README.md": "not copied\n", "notes.bin": "not copied\n"}
    for name, text in files.items():
        (src / name).write_text(text)
    return src
