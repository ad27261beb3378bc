"""Shared fixtures for the model tests: tiny configs and a tiny model."""

from __future__ import annotations

import pytest
import torch

from lumina.model import LuminaConfig, LuminaModel


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny-model tests are dominated by OpenMP barriers on a shared CPU; one thread is ~10-100x faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config() -> LuminaConfig:
    return LuminaConfig.tiny()


@pytest.fixture
def tiny_model(tiny_config: LuminaConfig) -> LuminaModel:
    torch.manual_seed(0)
    return LuminaModel(tiny_config)
