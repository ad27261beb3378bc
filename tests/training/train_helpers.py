"""Helpers of the training tests: compose conf/train.yaml with small, fast overrides (a helper module, not
conftest: `from conftest import` would resolve to whichever conftest pytest imported first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"


def small_data(num_samples: int = 24) -> list[str]:
    """A small built-in world (its longest sample still fits seq_len 256)."""
    return [f"data.sources.0.options.num_samples={num_samples}", "data.sources.0.options.val_samples=4"]


def quiet(output_dir: Path) -> list[str]:
    return [f"paths.output_dir={output_dir}", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "callbacks.progress_bar=null"]


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def run_cli(args: list[str], cwd: Path, timeout: int = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m lumina.train ARGS` in a fresh process (what `lumina-train` runs), with `env` added."""
    env = {**os.environ, **(env or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "lumina.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
