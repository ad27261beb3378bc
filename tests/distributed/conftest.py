"""Launches shared by the distributed tests: one "core" 2-rank gloo run (every check that keeps the process
group healthy), one "four" 4-rank run and one "hang" run (ends in a collective failure on purpose)."""

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


@pytest.fixture(scope="session")
def four(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], dict]:
    out = tmp_path_factory.mktemp("dist_four")
    torch.manual_seed(0)
    save_pretrained(LuminaModel(tiny_config()), out / "hf_in", layout="split")
    return run_scenario("four", out, expect_ok=True, world=4)


@pytest.fixture(scope="session")
def four_ranks(four) -> list[dict]:
    """The 4-rank run's sp=2 x ep=2 step, per rank."""
    return [four("four_sequence", rank) for rank in range(4)]
