"""lumina-generate's per-task settings: the values given in the config over the defaults of the checkpoint's
kind, `conf/generate/<kind>.yaml` (official, small, or a tokenizer set's name such as world; `generate=auto`
picks it: `checkpoint_kind`). Tasks are the request tasks of `lumina.contract.tasks` (understanding by the
media kind); a settings file names its prompt set of `lumina.contract.system_prompts` (`system_prompts:`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.system_prompts import PROMPT_SETS
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.model.config import LuminaConfig
from lumina.tokenizers.registry import TOKENIZER_SETS, tokenizer_set_of
from lumina.tokenizers.text import TextTokenizer

SETTINGS_DIR = Path(__file__).resolve().parents[2] / "conf" / "generate"
KINDS = ("official", "small")  # and every tokenizer set's name
OFFICIAL_CODES = (8, 4096)  # AToken: 8 codebooks of 4096 codes


def checkpoint_kind(config: LuminaConfig, tokens: SpecialTokens, text_tokenizer: TextTokenizer) -> str:
    """The name of the tokenizer set whose vocabulary the text tokenizer holds (e.g. "world"), "official" (an
    official-size model with the official special-token ids and AToken's 8 x 4096 codes), else "small"."""
    found = tokenizer_set_of(text_tokenizer)
    if found is not None:
        return found
    official, contract = LuminaConfig.official(), SpecialTokens.official()
    size = ("hidden_size", "num_hidden_layers", "num_experts")
    ids = ("boa", "eoa", "boi", "eoi", "text_mask", "user_open", "system_open", "img_context")
    if (all(getattr(config, k) == getattr(official, k) for k in size)
            and all(getattr(tokens, k) == getattr(contract, k) for k in ids)
            and (tokens.num_codebooks, tokens.codebook_size) == OFFICIAL_CODES):
        return "official"
    return "small"


def resolve_settings(cfg: DictConfig, kind: str) -> DictConfig:
    """The settings document: the one `generate=<kind>` composed in, else conf/generate/<kind>.yaml."""
    if cfg.get("by_task") is not None:
        return cfg
    kinds = (*KINDS, *TOKENIZER_SETS.names())
    if kind not in kinds or not (SETTINGS_DIR / f"{kind}.yaml").is_file():
        raise ValueError(f"generate={kind!r}: expected one of auto, {', '.join(kinds)} (with its "
                         f"{SETTINGS_DIR}/<kind>.yaml)")
    return OmegaConf.load(SETTINGS_DIR / f"{kind}.yaml")


def _task_node(settings: DictConfig, task: str) -> DictConfig:
    node = settings.by_task.get(task)
    if node is None:
        raise ValueError(f"the generation settings (system_prompts={settings.system_prompts}) have no defaults for "
                         f"task {task!r}; expected one of {list(settings.by_task)}")
    return node


def _merged(given: Any, defaults: Any) -> dict[str, Any]:
    given = OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else dict(given or {})
    defaults = OmegaConf.to_container(defaults, resolve=True) if OmegaConf.is_config(defaults) else {}
    return {**defaults, **{k: v for k, v in given.items() if v is not None}}


def _cache_settings(cfg: DictConfig) -> dict[str, Any]:
    """The top-level `cache` / `cache_budget_gib`, which both samplers read."""
    return {name: cfg[name] for name in ("cache", "cache_budget_gib") if cfg.get(name) is not None}


def text_config(cfg: DictConfig, settings: DictConfig, task: str) -> TextSamplingConfig:
    """cfg.text's set values over the task's defaults."""
    return TextSamplingConfig(**_merged(cfg.text, _task_node(settings, task).get("text")), **_cache_settings(cfg))


def image_config(cfg: DictConfig, settings: DictConfig, task: str) -> ImageSamplingConfig:
    """cfg.image's set values over the task's defaults; dual guidance (text_scale / image_scale > 0) starts
    from cfg_scale 0, as the official edit script requires."""
    values = _merged(cfg.image, _task_node(settings, task).get("image"))
    if (values.get("text_scale") or values.get("image_scale")) and cfg.image.get("cfg_scale") is None:
        values["cfg_scale"] = 0.0
    return ImageSamplingConfig(**values, **_cache_settings(cfg))


def default_grid(settings: DictConfig, task: str) -> tuple[int, int] | None:
    grid = _task_node(settings, task).get("grid")
    return None if grid is None else (int(grid[0]), int(grid[1]))


def system_prompt(cfg: DictConfig, settings: DictConfig, task: str) -> str:
    """cfg.system when given, else the settings' system prompt of `task`."""
    if cfg.get("system") is not None:
        return str(cfg.system)
    prompts = PROMPT_SETS.get(settings.system_prompts, "system_prompts")
    if task not in prompts:
        raise ValueError(f"system_prompts={settings.system_prompts} has no prompt for task {task!r}; pass system=...")
    return prompts[task]


def parameter_dtype(cfg: DictConfig, settings: DictConfig, device: str) -> str:
    """cfg.dtype, or with dtype=auto the settings' dtype_on_cuda on CUDA and float32 elsewhere."""
    if cfg.dtype != "auto":
        return str(cfg.dtype)
    return str(settings.dtype_on_cuda) if device.startswith("cuda") else "float32"
