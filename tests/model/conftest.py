"""Shared fixtures for the model tests: tiny configs and a tiny model."""

from __future__ import annotations

import pytest
import torch

from lumina.model import LuminaConfig, LuminaModel


@pytest.fixture
def tiny_config() -> LuminaConfig:
    return LuminaConfig.tiny()


@pytest.fixture
def tiny_model(tiny_config: LuminaConfig) -> LuminaModel:
    torch.manual_seed(0)
    return LuminaModel(tiny_config)
