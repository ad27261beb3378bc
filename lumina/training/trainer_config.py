"""`check_trainer_fields`: the `trainer` group's values checked before `lightning.Trainer` sees them, so a bad
override is one `ConfigError` naming the field and the value. Fields without a rule pass through."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L

from lumina.training.errors import ConfigError


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _int(v) and v >= low


def _fraction_or_count(v: Any) -> bool:
    """An int >= 0 (batches) or a float in [0, 1] (a share of the batches)."""
    return (_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0)


PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true", "transformer-engine",
              "transformer-engine-float16", "32", "bf16", "16", "64", 32, 16, 64)  # what Lightning 2.6 accepts

# field -> (rule, what the rule wants)
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_steps": (lambda v: _int(v) and (v >= 1 or v == -1), "an integer >= 1 (or -1: no step limit)"),
    "max_epochs": (lambda v: v is None or (_int(v) and v >= -1), "an integer >= -1 or null"),
    "min_steps": (lambda v: v is None or (_int(v) and v >= 0), "an integer >= 0 or null"),
    "accumulate_grad_batches": (_int_at_least(1), "an integer >= 1"),
    "gradient_clip_val": (lambda v: v is None or (_number(v) and v >= 0), "a number >= 0 or null"),
    "gradient_clip_algorithm": (lambda v: v in (None, "norm", "value"), "'norm', 'value' or null"),
    "log_every_n_steps": (_int_at_least(1), "an integer >= 1"),
    "val_check_interval": (lambda v: v is None or (_int(v) and v >= 1) or (isinstance(v, float) and 0 < v <= 1),
                           "an integer >= 1 (micro-batches), a float in (0, 1] or null"),
    "check_val_every_n_epoch": (lambda v: v is None or (_int(v) and v >= 1), "an integer >= 1 or null"),
    "limit_train_batches": (_fraction_or_count, "an integer >= 0 or a float in [0, 1]"),
    "limit_val_batches": (_fraction_or_count, "an integer >= 0 or a float in [0, 1]"),
    "num_sanity_val_steps": (_int_at_least(-1), "an integer >= -1"),
    "precision": (lambda v: v in PRECISIONS, f"one of {PRECISIONS[:6]} (or Lightning's aliases)"),
    "devices": (lambda v: v == "auto" or (_int(v) and (v >= 1 or v == -1))
                or (isinstance(v, list | tuple) and all(_int(d) and d >= 0 for d in v)),
                "an integer >= 1, -1, 'auto' or a list of device indices"),
    "num_nodes": (_int_at_least(1), "an integer >= 1"),
    **dict.fromkeys(("enable_progress_bar", "enable_model_summary", "enable_checkpointing",
                     "use_distributed_sampler"), (lambda v: isinstance(v, bool), "true or false")),
    "deterministic": (lambda v: v is None or isinstance(v, bool) or v == "warn", "true, false, 'warn' or null"),
    "fast_dev_run": (lambda v: isinstance(v, bool) or (_int(v) and v >= 0), "true, false or an integer >= 0"),
}


def check_trainer_fields(trainer: Mapping[str, Any]) -> None:
    """Raise ConfigError for the first unknown key (or one the run sets itself) or value outside its rule."""
    own = {"self", "strategy", "callbacks", "logger", "default_root_dir"}
    known = set(inspect.signature(L.Trainer.__init__).parameters) - own
    for name, value in trainer.items():
        if name not in known:
            raise ConfigError(f"trainer.{name}: not a lightning.Trainer argument this config sets (strategy, "
                              "callbacks and logger have their own groups)")
        rule = RULES.get(name)
        if rule is not None and not rule[0](value):
            raise ConfigError(f"trainer.{name}={value!r}: must be {rule[1]}")
