"""Launches shared by the distributed tests: one "core" 2-rank gloo run (every check that keeps the process
group healthy) and one "hang" run (ends in a collective failure on purpose)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from dist_helpers import launch, tiny_config

from lumina.checkpoint import save_pretrained
from lumina.model import LuminaModel


def _run(scenario: str, out: Path, expect_ok: bool) -> Callable[[str, int], dict]:
    results = launch(scenario, out)
    if expect_ok and any(r.returncode != 0 for r in results):
        tails = "\n".join(f"--- rank {i} (exit {r.returncode}) ---\n{r.stdout[-4000:]}" for i, r in enumerate(results))
        pytest.fail(f"distributed scenario {scenario!r} failed:\n{tails}")

    def load(name: str, rank: int) -> dict:
        return torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)
    load.out = out  # type: ignore[attr-defined]
    load.processes = results  # type: ignore[attr-defined]
    return load


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
    return _run("core", out, expect_ok=True)


@pytest.fixture(scope="session")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], dict]:
    return _run("hang", tmp_path_factory.mktemp("dist_hang"), expect_ok=False)
