"""Plug-ins (`lumina.plugins`) and the task table (`lumina.contract.tasks`): the built-in world registers itself
through its entry point, with no generic module importing it; a user's own installed plug-in adds a built-in
dataset and a task the same way; the request rule (image answer + source image = edit, ...) is the official one.
Each check runs in a fresh interpreter, so the plug-ins load as they would for a user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lumina.contract.tasks import request_task

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    path = [str(REPO)] + ([str(extra_path)] if extra_path is not None else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_world_registers_itself_when_a_generic_registry_is_first_read() -> None:
    result = _python("""
        import json, sys
        from lumina.contract.tasks import TASKS
        from lumina.data.builtin import BUILTIN_DATASETS
        from lumina.generation.evaluations import EVALUATIONS
        from lumina.tokenizers.registry import TOKENIZER_SETS
        before = "lumina.world" in sys.modules
        print(json.dumps({"before": before, "tasks": TASKS.names(), "datasets": BUILTIN_DATASETS.names(),
                          "evaluations": EVALUATIONS.names(), "tokenizers": TOKENIZER_SETS.names(),
                          "after": "lumina.world.plugin" in sys.modules}))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["before"] is False and found["after"] is True
    assert {"vqa", "text_qa"} <= set(found["tasks"])  # the world's own rows
    assert found["datasets"] == found["evaluations"] == found["tokenizers"] == ["world"]


@pytest.mark.parametrize(("image_answer", "media", "task"), [
    (True, ["image"], "edit"), (True, [], "t2i"), (False, [], "text"), (False, ["image"], "understand"),
    (False, ["video"], "understand_video"), (False, ["mesh3d", "image"], "understand_mesh3d"),
])
def test_a_request_names_its_task_by_answer_and_media(image_answer: bool, media: list[str], task: str) -> None:
    assert request_task(image_answer, media).name == task


def _user_plugin(root: Path) -> None:
    """An installed distribution `toy-plugin` (its dist-info on sys.path) whose entry point registers a task
    and a built-in dataset (the world's samples of one task, under another name)."""
    (root / "toy_plugin").mkdir()
    (root / "toy_plugin" / "__init__.py").write_text(textwrap.dedent("""
        from lumina.contract.tasks import Task, register_task
        from lumina.data.builtin import BUILTIN_DATASETS
        from lumina.world.dataset import build_world, world_assets

        COUNT = register_task(Task("count", "image", "text", "understand"))

        class Toy:
            def datasets(self, options, field):
                train = build_world("train", options["n"], 0, {"vqa": 1.0})
                return train.dataset, None

            def assets(self):
                return world_assets()

        BUILTIN_DATASETS.add("toy", Toy())
    """))
    info = root / "toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lumina.plugins]\ntoy = toy_plugin\n")


def test_a_users_installed_plugin_adds_a_dataset_and_a_task(tmp_path: Path) -> None:
    _user_plugin(tmp_path)
    result = _python("""
        import json
        from lumina.contract.tasks import TASKS
        from lumina.model.config import LuminaConfig
        from lumina.training.data_factory import build_datamodule
        from lumina.training.errors import ConfigError

        source = {"name": "mine", "path": None, "builtin": "toy", "options": {"n": 12}}
        dm = build_datamodule({"pad_id": 0, "num_codebooks": 4, "sources": [source]}, LuminaConfig.tiny())
        try:  # two built-in datasets now: a source must say which
            build_datamodule({"pad_id": 0, "num_codebooks": 4, "sources": [{"name": "w", "path": None}]},
                             LuminaConfig.tiny())
            ambiguous = None
        except ConfigError as error:
            ambiguous = str(error)
        print(json.dumps({"samples": len(dm.train_source.dataset), "count": TASKS.get("count", "task").media,
                          "ambiguous": ambiguous}))
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["samples"] == 12 and found["count"] == "image"
    assert "data.sources[0].builtin=null" in found["ambiguous"] and "['toy', 'world']" in found["ambiguous"]


def test_an_unknown_builtin_dataset_is_refused_naming_the_field() -> None:
    result = _python("""
        from lumina.model.config import LuminaConfig
        from lumina.training.data_factory import build_datamodule
        build_datamodule({"pad_id": 0, "num_codebooks": 4,
                          "sources": [{"name": "w", "path": None, "builtin": "nope"}]}, LuminaConfig.tiny())
    """)
    assert result.returncode == 1
    assert "data.sources[0].builtin='nope': no built-in dataset of that name (registered: world)" in result.stderr
