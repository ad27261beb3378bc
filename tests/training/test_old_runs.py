"""Runs started before the parts refactor (issue 41) keep working: a Lightning checkpoint written then (its
saved hyper-parameters lack the part keys and still name the old `p_source: sigmoid`) resumes on the official
parts, and every Hydra `_target_` in conf/ resolves."""

from __future__ import annotations

import math
import re

import hydra
import pytest
import torch
from test_train_resume import losses_by_process
from train_helpers import CONF_DIR, run_cli, small_data

from lumina.model.config import PART_KEYS

COMMON = ["experiment=debug", "trainer.limit_val_batches=0", "callbacks.checkpoint.every_n_train_steps=2",
          "callbacks.progress_bar=null", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
          "logger=csv", "callbacks.expert_usage=null", *small_data(num_samples=24)]
# LuminaConfig fields added by the refactor: a pre-refactor checkpoint's hyper_parameters["model"] has none
NEW_MODEL_KEYS = PART_KEYS  # image_head, masking_schedule, attn_rule


def test_a_checkpoint_saved_without_the_part_keys_resumes_on_the_official_parts_only(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli([*COMMON, f"hydra.run.dir={run_dir}", "trainer.max_steps=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    model_hparams = checkpoint["hyper_parameters"]["model"]
    assert set(NEW_MODEL_KEYS) <= set(model_hparams)  # what the edit below removes is really there
    for key in NEW_MODEL_KEYS:
        del model_hparams[key]
    checkpoint["hyper_parameters"]["objective"]["balance"]["p_source"] = "sigmoid"  # the old name of "router"
    torch.save(checkpoint, last)

    # another part than the run's (the official one, as the key is missing) is refused, naming the field
    no_log = [arg for arg in COMMON if arg != "logger=csv"]
    refused = run_cli([*no_log, "logger=none", "image_head=parallel", f"hydra.run.dir={run_dir}",
                       "trainer.max_steps=3"], cwd=tmp_path)
    assert refused.returncode != 0
    assert "model.config.image_head='parallel': the checkpoint was trained with 'channel_ar'" in refused.stderr

    second = run_cli([*COMMON, f"hydra.run.dir={run_dir}", "trainer.max_steps=3"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    before, after = losses_by_process(run_dir)
    assert sorted(before) == [0, 1] and sorted(after) == [2]  # it resumed at step 2, not from scratch
    assert math.isfinite(after[2])


def _targets() -> list[str]:
    found = set()
    for path in CONF_DIR.rglob("*.yaml"):
        found.update(re.findall(r"^\s*_target_:\s*(\S+)", path.read_text(), flags=re.MULTILINE))
    return sorted(found)


def test_conf_names_targets() -> None:
    assert "lumina.distributed.FSDP2ExpertParallelStrategy" in _targets()


@pytest.mark.parametrize("target", _targets())
def test_every_target_in_conf_resolves(target: str) -> None:
    if target.startswith("hydra_plugins."):  # the SLURM launcher: an optional Hydra plugin
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    assert isinstance(hydra.utils.get_class(target), type)
