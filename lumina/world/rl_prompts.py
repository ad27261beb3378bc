"""`WorldPrompts`: the built-in world's items as post-training prompts (`rollout.prompts`, conf/rollout/world.yaml)."""

from __future__ import annotations

from pathlib import Path

from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import copy_assets
from lumina.generation.sequences import Prompt
from lumina.post_training.prompts import PromptDataModule
from lumina.post_training.samples import RLPrompt
from lumina.world.dataset import build_world, world_assets
from lumina.world.scene import IMAGE_SIZE
from lumina.world.tasks import TASKS


class WorldPrompts(PromptDataModule):
    """split / num_items / mix / world_seed: the world items (`build_world`); prompts_per_step, seed: as
    `PromptDataModule`."""

    def __init__(self, prompts_per_step: int, split: str = "train", num_items: int = 2000,
                 mix: dict[str, float] | None = None, world_seed: int = 0, seed: int = 0) -> None:
        super().__init__(prompts_per_step, seed)
        mix = dict(mix or {task: 1.0 for task in TASKS})
        for task in mix:
            if task not in TASKS:
                raise ValueError(f"rollout.prompts.mix: task {task!r} is not one of the world's {TASKS}")
        self.split, self.num_items, self.mix, self.world_seed = split, num_items, mix, world_seed
        self.tasks = tuple(sorted(t for t, w in mix.items() if w > 0))

    def load_prompts(self) -> tuple[list[RLPrompt], SpecialTokens]:
        world = build_world(self.split, self.num_items, self.world_seed, mix=self.mix)
        side = IMAGE_SIZE // world.image_tokenizer.patch_size
        prompts = [RLPrompt(Prompt.of_sample(world.dataset[i], (side, side) if item.target is not None else None),
                            item.task, item) for i, item in enumerate(world.items)]
        return prompts, world.tokens

    def export_assets(self, directory: str | Path) -> list[Path]:
        """The world's tokenizer.json into an HF export (as the supervised run's data module does)."""
        return copy_assets(world_assets(), directory)
