"""Small post-training runs for the tests: compose conf/train.yaml with tiny rollouts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train_helpers import compose_train, quiet, run_cli  # noqa: E402

TINY_ROLLOUT = ["rollout.group_size=3", "rollout.prompts_per_step=2", "rollout.image_steps=3",
                "rollout.text_length=4", "rollout.block_length=4", "rollout.text_steps=2",
                "rollout.prompts.num_items=40", "trainer.limit_val_batches=0", "callbacks.conditioning=null",
                "optim.warmup_steps=0"]

__all__ = ["TINY_ROLLOUT", "compose_train", "quiet", "run_cli"]
