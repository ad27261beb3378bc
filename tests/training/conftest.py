"""Fixtures of the training tests."""

from pathlib import Path

import pytest
from train_helpers import CONF_DIR


@pytest.fixture
def conf_dir() -> Path:
    return CONF_DIR
