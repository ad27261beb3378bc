"""Shared fixtures of the generation tests: a tiny model and its special tokens."""

from __future__ import annotations

import pytest
import torch

from lumina.contract.special_tokens import SpecialTokens
from lumina.model import LuminaModel
from lumina.model.config import LuminaConfig

TINY_TOKENS = dict(pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7, bo3d=8, eo3d=9, system_open=10,
                   system_close=11, user_open=12, user_close=13, uncondition=14, img_context=500,
                   video_context=501, mesh3d_context=502, newline=503)


@pytest.fixture
def tokens() -> SpecialTokens:
    return SpecialTokens(**TINY_TOKENS, text_vocab_size=512, codebook_size=64, num_codebooks=4)


@pytest.fixture
def tiny_model() -> LuminaModel:
    torch.manual_seed(0)
    return LuminaModel(LuminaConfig.tiny()).eval()
