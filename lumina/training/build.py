"""Objects of one training run, built from the composed Hydra config (conf/train.yaml)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from lumina.model.config import LuminaConfig
from lumina.objective import ObjectiveConfig
from lumina.post_training.mode import PostTraining, build_post_training
from lumina.post_training.prompts import PromptDataModule
from lumina.training.data_factory import build_datamodule
from lumina.training.errors import ConfigError
from lumina.training.module import LuminaModule
from lumina.training.optim import OptimConfig
from lumina.training.trainer_config import check_trainer_fields

PRESETS = ("tiny", "official")
MODEL_KEYS = ("preset", "init_from", "freeze", "meta_init", "compile", "config")


def plain(node: Any) -> Any:
    """A config node as plain Python containers (interpolations resolved)."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def check_requirements(cfg: DictConfig) -> None:
    """Checks that need no model or data: a GPU when the config asks for one, a learning-rate horizon."""
    if cfg.get("requires_cuda", False) and not torch.cuda.is_available():
        raise ConfigError("requires_cuda=true: this configuration needs a CUDA GPU and none is visible")
    check_trainer_fields(plain(cfg.trainer))
    max_steps = cfg.trainer.get("max_steps", -1)
    if cfg.optim.get("decay_steps") is None and not cfg.trainer.get("fast_dev_run") and \
            (max_steps is None or max_steps < 1):
        raise ConfigError(f"trainer.max_steps={max_steps}: must be >= 1 (it sets the cosine horizon; or set "
                          "optim.decay_steps)")


def model_config(cfg: DictConfig) -> LuminaConfig:
    """cfg.model -> LuminaConfig: the preset (or init_from's config.json) with cfg.model.config applied."""
    node = cfg.model
    unknown = sorted(set(node.keys()) - set(MODEL_KEYS))
    if unknown:
        raise ConfigError(f"model.{unknown[0]}: unknown key (expected one of {MODEL_KEYS}; architecture fields "
                          f"go under model.config)")
    overrides = plain(node.get("config")) or {}
    fields = {f.name for f in dataclasses.fields(LuminaConfig)}
    for key in overrides:
        if key not in fields:
            raise ConfigError(f"model.config.{key}: not a LuminaConfig field")
    if OmegaConf.is_missing(node, "init_from"):
        raise ConfigError("model.init_from=???: required by this config (an HF checkpoint directory), "
                          "e.g. model.init_from=outputs/run/hf")
    init_from = node.get("init_from")
    if init_from is not None:
        config_json = Path(init_from) / "config.json"
        if not config_json.is_file():
            raise ConfigError(f"model.init_from={init_from!r}: no config.json there (expected an HF checkpoint "
                              "directory)")
        return LuminaConfig.from_hf(config_json, **overrides)
    preset = node.get("preset")
    if preset not in PRESETS:
        raise ConfigError(f"model.preset={preset!r}: must be one of {PRESETS} (or set model.init_from)")
    return getattr(LuminaConfig, preset)(**overrides)


def module(cfg: DictConfig) -> LuminaModule:
    objective = ObjectiveConfig(**plain(cfg.objective))
    optim = OptimConfig(**plain(cfg.optim))
    return LuminaModule(model_config(cfg), objective=objective, optim=optim,
                        init_from=cfg.model.get("init_from"), freeze=model_freeze(cfg),
                        meta_init=bool(cfg.model.get("meta_init", False)), compile=model_compile(cfg),
                        adapter=plain(cfg.get("adapter")), post_training=post_training(cfg, objective))


def post_training(cfg: DictConfig, objective: ObjectiveConfig) -> PostTraining | None:
    """The post-training mode `objective.post_training` asks for (rollout and reward groups), else None."""
    if objective.post_training is None:
        return None
    rewards = hydra.utils.instantiate(cfg.get("reward")) if cfg.get("reward") is not None else None
    try:
        return build_post_training(dict(objective.post_training), plain(cfg.get("rollout")),
                                   None if rewards is None else dict(rewards))
    except ValueError as error:
        raise ConfigError(str(error)) from error


def model_freeze(cfg: DictConfig) -> list[str]:
    """cfg.model.freeze (default none): a list of parameter-name globs, else ConfigError."""
    value = plain(cfg.model.get("freeze"))
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"model.freeze={value!r}: must be a list of parameter-name globs")
    return value


def model_compile(cfg: DictConfig) -> bool:
    """cfg.model.compile (default false): a bool, else ConfigError naming the field."""
    value = cfg.model.get("compile", False)
    if not isinstance(value, bool):
        raise ConfigError(f"model.compile={value!r}: must be true or false")
    return value


def datamodule(cfg: DictConfig, model_cfg: LuminaConfig):
    """The data module, its first epoch planned now so that data errors surface before training starts; in the
    post-training mode the prompts of `rollout.prompts` instead."""
    if cfg.objective.get("post_training") is not None:
        rollout = plain(cfg.rollout)
        dm = hydra.utils.instantiate(rollout.get("prompts", {}), prompts_per_step=rollout["prompts_per_step"],
                                     _convert_="all")
        if not isinstance(dm, PromptDataModule):
            raise ConfigError(f"rollout.prompts: {type(dm).__name__} is not a PromptDataModule (set its _target_, "
                              "e.g. lumina.world.rl_prompts.WorldPrompts)")
        dm.setup("fit")
        return dm
    dm = build_datamodule(plain(cfg.data), model_cfg)
    dm.schedule.plan()
    return dm


def callbacks(cfg: DictConfig, post_training: PostTraining | None = None) -> list[L.Callback]:
    """Every non-null entry of cfg.callbacks, less progress bars and model summaries the trainer disables. In
    the post-training mode a checkpoint callback's interval must fall between rollout cycles."""
    out = []
    switched_off = tuple(kind for key, kind in (("enable_progress_bar", L.pytorch.callbacks.ProgressBar),
                                                ("enable_model_summary", L.pytorch.callbacks.ModelSummary))
                         if not cfg.trainer.get(key, True))
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is None:
            continue
        if "_target_" not in node:
            raise ConfigError(f"callbacks.{name}: needs a _target_ (or null to switch it off)")
        callback = hydra.utils.instantiate(node)
        if post_training is not None and isinstance(callback, L.pytorch.callbacks.ModelCheckpoint):
            try:
                post_training.config.check_checkpoint_interval(node.get("every_n_train_steps"),
                                                               node.get("train_time_interval"), f"callbacks.{name}")
            except ValueError as error:
                raise ConfigError(str(error)) from error
        if not isinstance(callback, switched_off):
            out.append(callback)
    return out


def loggers(cfg: DictConfig) -> list[L.pytorch.loggers.Logger]:
    return [hydra.utils.instantiate(node) for node in (cfg.get("logger") or {}).values() if node is not None]


def strategy(cfg: DictConfig) -> Any:
    node = cfg.get("strategy")
    if node is None:
        return "auto"
    if "_target_" in node:
        return hydra.utils.instantiate(node)
    return node.get("name", "auto")


def trainer(cfg: DictConfig, callback_list: list[L.Callback], logger_list: list) -> L.Trainer:
    """lightning.Trainer from cfg.trainer; what Lightning refuses is a ConfigError."""
    kwargs = plain(cfg.trainer)
    check_trainer_fields(kwargs)
    try:
        return L.Trainer(**kwargs, strategy=strategy(cfg), callbacks=callback_list,
                         logger=logger_list if logger_list else False,
                         default_root_dir=str(cfg.paths.output_dir))
    except MisconfigurationException as error:
        raise ConfigError(f"trainer: {error}") from error


def resume_path(cfg: DictConfig, callback_list: list[L.Callback]) -> str | None:
    """cfg.ckpt_path: "last" -> <checkpoint dir>/last.ckpt if it exists; a path must exist; null -> None."""
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        for callback in callback_list:
            if isinstance(callback, L.pytorch.callbacks.ModelCheckpoint) and callback.dirpath:
                last = Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
                if last.exists():  # a file, or a directory (distributed checkpoint)
                    return str(last)
        return None
    if not Path(ckpt_path).exists():
        raise ConfigError(f"ckpt_path={ckpt_path!r}: no such checkpoint file")
    return str(ckpt_path)
