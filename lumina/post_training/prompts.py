"""The prompts a post-training run rolls out: a `PromptDataModule` (a plug-in's subclass, named by
`rollout.prompts._target_`; the built-in world's: `lumina.world.rl_prompts.WorldPrompts`) holds its prompts and
draws `prompts_per_step` of them per micro-batch, from a seeded shuffle (a new shuffle each pass).
Micro-batch k's prompts depend only on (seed, k), and a (re)started run begins at k = global step x
accumulation, so a resumed run draws what the uninterrupted one would have."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lumina.contract.special_tokens import SpecialTokens
from lumina.data.noise import stable_seed
from lumina.post_training.samples import RLPrompt


class PromptBatch:
    """Micro-batch `index`: its prompts, the tokens they are laid out with, every task the run draws from
    (the same on every rank, so per-task metrics reduce in step). A plain class: Lightning moves batches by
    walking dataclasses and tuples, and prompts stay on the CPU (the samplers lay them out)."""

    def __init__(self, index: int, prompts: list[RLPrompt], tokens: SpecialTokens, tasks: tuple[str, ...]):
        self.index, self.prompts, self.tokens, self.tasks = index, prompts, tokens, tasks


class PromptDataModule(L.LightningDataModule):
    """prompts_per_step: prompts per micro-batch on each data-parallel rank (rank r of R takes every R-th
    prompt of a global draw); seed: of the shuffles. A subclass says where the prompts come from:
    `load_prompts()` -> (prompts, their special tokens), `tasks` (every task it draws, sorted), and
    `export_assets(directory)` (the tokenizers an HF export of the run carries)."""

    tasks: tuple[str, ...] = ()

    def __init__(self, prompts_per_step: int, seed: int = 0) -> None:
        super().__init__()
        self.prompts_per_step, self.seed = prompts_per_step, seed
        self.prompts: list[RLPrompt] = []
        self.tokens: SpecialTokens | None = None

    def load_prompts(self) -> tuple[list[RLPrompt], SpecialTokens]:
        raise NotImplementedError

    def export_assets(self, directory: str | Path) -> list[Path]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if not self.prompts:
            self.prompts, self.tokens = self.load_prompts()

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
