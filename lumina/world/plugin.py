"""The built-in world as a lumina plug-in (the `lumina.plugins` entry point in pyproject.toml): importing this
module registers its tasks (vqa, text_qa, by importing `lumina.world.tasks`), its system prompts ("world"),
its tokenizers ("world"; the visual one as "builtin"), its dataset (a data source with `path: null`) and its
`lumina-generate task=eval` evaluation."""

from __future__ import annotations

from typing import Any

from lumina.contract.system_prompts import PROMPT_SETS
from lumina.data.builtin import BUILTIN_DATASETS
from lumina.data.dataset_assets import DatasetAssets
from lumina.generation.evaluations import EVALUATIONS
from lumina.tokenizers.registry import TOKENIZER_SETS, VISUAL_TOKENIZERS, TokenizerSet
from lumina.training.errors import ConfigError
from lumina.world.dataset import (
    build_world,
    world_assets,
    world_special_tokens,
    world_text_tokenizer,
    world_visual_tokenizer,
)
from lumina.world.evaluation import run_world_eval
from lumina.world.tasks import WORLD_SYSTEM_PROMPTS

NAME = "world"
VISUAL = "builtin"
OPTIONS = ("num_samples", "val_samples", "seed", "mix")


class WorldDataset:
    """The built-in dataset: options num_samples (2000), val_samples (64), seed (0), mix (task -> weight)."""

    def datasets(self, options: dict[str, Any], field: str):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"{field}.{unknown[0]}: unknown option of the built-in world (expected {OPTIONS})")
        seed = int(options.get("seed", 0))
        train = build_world("train", int(options.get("num_samples", 2000)), seed, options.get("mix"))
        val = build_world("val", int(options.get("val_samples", 64)), seed, options.get("mix"),
                          image_tokenizer=train.image_tokenizer)
        return train.dataset, val.dataset

    def assets(self) -> DatasetAssets:
        return world_assets()  # the HF export carries the world's tokenizer.json (its vocabulary version)


PROMPT_SETS.add(NAME, WORLD_SYSTEM_PROMPTS)
VISUAL_TOKENIZERS.add(VISUAL, world_visual_tokenizer)
TOKENIZER_SETS.add(NAME, TokenizerSet(world_text_tokenizer, VISUAL, world_special_tokens))
BUILTIN_DATASETS.add(NAME, WorldDataset())
EVALUATIONS.add(NAME, run_world_eval)
