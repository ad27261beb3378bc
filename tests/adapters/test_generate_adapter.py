"""`lumina-generate adapter_dir=DIR`: a base checkpoint plus a LoRA adapter in PEFT's format, unmerged, answers as
the merged export does (greedy text, fp32), and not as the base alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lumina.adapters import LoRA, merged_state_dict, save_peft_adapter
from lumina.checkpoint import load_pretrained, save_pretrained

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
TRAIN = "from lumina.cli.train import main; main()"
GENERATE = "from lumina.cli.generate import main; main()"


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A 2-step built-in-world run's export (the base, with its tokenizer), a LoRA adapter on it (B drawn
    non-zero) and the merged export of base + adapter."""
    root = tmp_path_factory.mktemp("generate_adapter")
    _run([TRAIN, "experiment=debug", "trainer.max_steps=2", "logger=none", "callbacks.progress_bar=null",
          "callbacks.expert_usage=null", "callbacks.conditioning=null", "callbacks.checkpoint=null",
          "trainer.enable_model_summary=false", "data.sources.0.options.num_samples=40",
          "data.sources.0.options.val_samples=8", f"hydra.run.dir={root / 'run'}"], cwd=root)
    base = root / "run" / "hf"
    model = load_pretrained(base)
    LoRA(rank=4, alpha=8, seed=3).apply(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    adapter = save_peft_adapter(model, root / "adapter")
    merged = save_pretrained(merged_state_dict(model), root / "merged", config=model.config, source_dir=base)
    return base, adapter, merged


def answers(checkpoint, out, adapter=None) -> list[list[int]]:
    extra = [f"adapter_dir={adapter}"] if adapter is not None else []
    _run([GENERATE, "task=text", f"checkpoint={checkpoint}", *extra, "device=cpu", "dtype=float32",
          'prompts=["what colour is a red circle ?","how many sides does a square have ?"]', "text.gen_length=8",
          "text.block_length=4", "text.steps=4", "text.temperature=0.0", f"hydra.run.dir={out}"], cwd=out.parent)
    return [json.loads(line)["ids"] for line in (out / "answers.jsonl").read_text().splitlines()]


def test_base_plus_adapter_answers_as_the_merged_export(checkpoints, tmp_path):
    base, adapter, merged = checkpoints
    with_adapter = answers(base, tmp_path / "adapted", adapter)
    assert with_adapter == answers(merged, tmp_path / "merged")
    assert with_adapter != answers(base, tmp_path / "base")  # the adapter changed the answers
