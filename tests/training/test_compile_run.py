"""`model.compile=true` through the real Trainer: the compiled run logs `compile/graphs` every step, and over
20 steps of packs of varying composition (supervised text and image rows, segments, tokens per expert) after
its warm-up it compiles nothing more. A bad value is an error naming the field."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import compose_train, quiet, small_data

from lumina.training import build
from lumina.training.errors import ConfigError
from lumina.training.run import run

WARM_UP = 2  # steps: the first compiles each region, the second the resume points it reaches first
STEPS = WARM_UP + 20


def test_compiled_run_compiles_nothing_after_its_warm_up(tmp_path) -> None:
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), *small_data(48), "logger=tensorboard",
                         "model.compile=true", f"trainer.max_steps={STEPS}", "trainer.limit_val_batches=0",
                         "callbacks.checkpoint.every_n_train_steps=11"])
    outputs = run(cfg)
    events = EventAccumulator(str(outputs.tensorboard), size_guidance={"scalars": 0})
    events.Reload()

    def values(tag: str) -> list[float]:
        return [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]

    graphs = values("compile/graphs")
    assert len(graphs) == STEPS and graphs[0] > 0
    compositions = set(zip(values("train/text_tokens"), values("train/image_tokens"), strict=True))
    assert len(compositions) >= 10  # the packs really differ
    assert graphs[WARM_UP:] == [graphs[WARM_UP - 1]] * (STEPS - WARM_UP), graphs


@pytest.mark.parametrize("value", ["yes", 1, "null"])
def test_bad_compile_value_names_the_field(tmp_path, value) -> None:
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), f"model.compile={value}"])
    with pytest.raises(ConfigError, match=r"model\.compile="):
        build.module(cfg)
