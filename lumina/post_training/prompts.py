"""The prompts a post-training run rolls out: `PromptDataModule` draws `prompts_per_step` of the built-in world's
items per micro-batch, from a seeded shuffle of the split (a new shuffle each pass). Micro-batch k's prompts
depend only on (seed, k), and a (re)started run begins at k = global step x accumulation, so a resumed run
draws what the uninterrupted one would have."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import copy_assets
from lumina.data.noise import stable_seed
from lumina.generation.sequences import Prompt
from lumina.post_training.samples import IMAGE_TASKS, TEXT_TASKS, RLPrompt
from lumina.world.dataset import build_world, world_assets

WORLD_TASKS = TEXT_TASKS + IMAGE_TASKS


class PromptBatch:
    """Micro-batch `index`: its prompts, the tokens they are laid out with, every task the run draws from
    (the same on every rank, so per-task metrics reduce in step). A plain class: Lightning moves batches by
    walking dataclasses and tuples, and prompts stay on the CPU (the samplers lay them out)."""

    def __init__(self, index: int, prompts: list[RLPrompt], tokens: SpecialTokens, tasks: tuple[str, ...]):
        self.index, self.prompts, self.tokens, self.tasks = index, prompts, tokens, tasks


class PromptDataModule(L.LightningDataModule):
    """split / num_items / mix / world_seed: the world items (`build_world`); prompts_per_step: prompts per
    micro-batch on each data-parallel rank (rank r of R takes every R-th prompt of a global draw); seed: of
    the shuffles."""

    def __init__(self, prompts_per_step: int, split: str = "train", num_items: int = 2000,
                 mix: dict[str, float] | None = None, world_seed: int = 0, seed: int = 0) -> None:
        super().__init__()
        mix = dict(mix or {task: 1.0 for task in WORLD_TASKS})
        for task in mix:
            if task not in WORLD_TASKS:
                raise ValueError(f"rollout.prompts.mix: task {task!r} is not one of the world's {WORLD_TASKS}")
        self.prompts_per_step, self.split, self.num_items = prompts_per_step, split, num_items
        self.mix, self.world_seed, self.seed = mix, world_seed, seed
        self.tasks = tuple(sorted(t for t, w in mix.items() if w > 0))
        self.prompts: list[RLPrompt] = []
        self.tokens: SpecialTokens | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.prompts:
            return
        world = build_world(self.split, self.num_items, self.world_seed, mix=self.mix)
        side = 32 // world.image_tokenizer.patch_size
        self.tokens = world.tokens
        self.prompts = [RLPrompt(Prompt.of_sample(world.dataset[i], (side, side) if item.target is not None else None),
                                 item.task, item) for i, item in enumerate(world.items)]

    def prompts_for(self, index: int, rank: int = 0, world_size: int = 1) -> list[RLPrompt]:
        """Micro-batch `index`'s prompts on `rank`: items [index * P * R, (index + 1) * P * R) of the
        concatenated seeded shuffles, every R-th from `rank`."""
        n, count = len(self.prompts), self.prompts_per_step * world_size
        out = []
        for position in range(index * count + rank, (index + 1) * count, world_size):
            shuffle, offset = divmod(position, n)
            out.append(self.prompts[_shuffle(self.seed, shuffle, n)[offset]])
        return out

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start, rank, world = 0, 0, 1
        if trainer is not None:
            start = trainer.global_step * trainer.accumulate_grad_batches
            rank, world = trainer.global_rank, trainer.world_size
        return DataLoader(_Batches(self, start, rank, world), batch_size=None, collate_fn=_as_is)

    def export_assets(self, directory: str | Path) -> list[Path]:
        """The world's tokenizer.json into an HF export (as the supervised run's data module does)."""
        return copy_assets(world_assets(), directory)


class _Batches(IterableDataset):
    def __init__(self, data: PromptDataModule, start: int, rank: int, world: int) -> None:
        self.data, self.start, self.rank, self.world = data, start, rank, world

    def __iter__(self):
        index = self.start
        while True:
            yield PromptBatch(index, self.data.prompts_for(index, self.rank, self.world), self.data.tokens,
                              self.data.tasks)
            index += 1


@functools.lru_cache(maxsize=4)
def _shuffle(seed: int, index: int, n: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(stable_seed(seed, index))).tolist()


def _as_is(batch: PromptBatch) -> PromptBatch:
    return batch
