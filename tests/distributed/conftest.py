"""Launches shared by the distributed tests: one "core" 2-rank gloo run (every check that keeps the process
group healthy) and one "hang" run (ends in a collective failure on purpose)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from dist_helpers import run_scenario, tiny_config

from lumina.checkpoint import save_pretrained
from lumina.model import LuminaModel


@pytest.fixture(scope="session")
def reference_state() -> dict[str, torch.Tensor]:
    """The weights every run starts from (seed 0)."""
    torch.manual_seed(0)
    return {k: v.clone() for k, v in LuminaModel(tiny_config()).state_dict().items()}


@pytest.fixture(scope="session")
def core(tmp_path_factory: pytest.TempPathFactory, reference_state) -> Callable[[str, int], dict]:
    out = tmp_path_factory.mktemp("dist_core")
    torch.manual_seed(0)
    save_pretrained(LuminaModel(tiny_config()), out / "hf_in", layout="split")
    return run_scenario("core", out, expect_ok=True)


@pytest.fixture(scope="session")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], dict]:
    return run_scenario("hang", tmp_path_factory.mktemp("dist_hang"), expect_ok=False)
