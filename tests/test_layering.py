"""The import-linter contracts of pyproject.toml (the README's layering, no import circle) hold for lumina/,
and break when a planted import closes a circle or points up the layers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the lumina/ package and the contracts under `root`."""
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", script, "--no-cache"], cwd=root, env={"PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=300)


def test_lumina_keeps_its_import_contracts() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "planted", "broken"), [
    # a TYPE_CHECKING-only import that closes a circle inside a package
    ("attention/runs.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lumina.attention.spec import AttentionSpec\n",
     "no import circle among the modules of a package BROKEN"),
    # a lazy import up the layers: the model reaching into training
    ("model/moe.py", "def _planted():\n    from lumina.training.run import run\n",
     "packages import only from the layers below them BROKEN"),
    # generic generation code reaching for the built-in world
    ("generation/run.py", "def _planted():\n    from lumina.world.tasks import WORLD_TASKS\n",
     "the built-in world is a plug-in: only the command line imports it BROKEN"),
], ids=["type_checking_circle", "lazy_import_up_the_layers", "generic_code_imports_the_world"])
def test_a_planted_import_breaks_a_contract(tmp_path: Path, module: str, planted: str, broken: str) -> None:
    shutil.copytree(REPO / "lumina", tmp_path / "lumina", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with (tmp_path / "lumina" / module).open("a") as file:
        file.write("\n" + planted)
    result = lint_imports(tmp_path)
    assert result.returncode == 1 and broken in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
