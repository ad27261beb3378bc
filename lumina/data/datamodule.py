"""`LuminaDataModule`: packed batches for every data-parallel rank, with an exact, rank-count-agnostic resume.

Packs are dealt as `lumina.data.epoch_plan` describes over the strategy's `distributed_sampler_kwargs` (else the
whole world; a sequence-parallel group is one data-parallel rank). The cursor advances only when a training
step finishes (`PackCursorCallback`, installed in `setup`), so prefetched but untrained batches are not lost;
`state_dict()` holds (epoch, cursor). The trainer needs `use_distributed_sampler=False`.
"""

from __future__ import annotations

import logging
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from lumina.data.dataset_assets import DatasetAssets, copy_assets
from lumina.data.epoch_plan import PackSchedule, deal, plan_epoch, steps_left
from lumina.data.packed_dataset import FixedSampler, PackedDataset, PackSampler, identity, keys_for
from lumina.data.packing import OVERLONG_POLICIES, PACK_ORDERS
from lumina.data.sources import MixtureSource, PackSource

log = logging.getLogger(__name__)

PAD_TOKEN_ID = 156892  # official pad_token_id


def _type_matches(value: Any, hint: Any) -> bool:
    """Whether `value` has the annotated type `hint` (int, float, bool, str, None, list[...], dict[...] and their
    unions; a bool is not an int, an int is a float; Any matches anything)."""
    if hint is Any:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_type_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(hint)
    if origin is list:
        return isinstance(value, list | tuple)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def check_field_types(config: Any, name: str) -> None:
    """ValueError naming `name.field` and the value when a field of dataclass `config` does not have its
    annotated type (e.g. `data.seq_len=abc` from the command line)."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        if not _type_matches(value, hints[f.name]):
            wanted = str(hints[f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise ValueError(f"{name}.{f.name}={value!r}: expected {wanted}")


@dataclass
class SourceSpec:
    """A mixture source: name, weight, `path` (Parquet shards; None: the built-in dataset `builtin`, by
    default the only one registered, `lumina.data.builtin`), source `options`."""

    name: str
    weight: float = 1.0
    path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    builtin: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self, f"DataConfig.sources[{self.name!r}]")


@dataclass
class DataConfig:
    """Data settings (Hydra-instantiable); `noise` holds NoiseConfig fields."""

    seq_len: int = 4096
    seed: int = 0
    num_workers: int = 0
    persistent_workers: bool = True
    prefetch_factor: int | None = None
    pin_memory: bool | None = None  # page-locked batches for async host-to-GPU copies; None: on a CUDA trainer
    overlong: str = "error"  # OverlongPolicy: "error" | "skip" (a plain str so OmegaConf can type it)
    pack_order: str = "shuffled"  # PackOrder: "shuffled" (tasks mixed in every pack) | "longest_first"
    pad_id: int | None = PAD_TOKEN_ID  # None: the data's own (resolved by the data factory)
    num_codebooks: int | None = 8      # None: the data's own
    sources: list[SourceSpec] = field(default_factory=list)
    noise: dict[str, Any] = field(default_factory=dict)
    val_noise_t: float = 0.5
    val_seed: int = 1234
    samples_per_epoch: int | None = None  # mixture slots per epoch (several sources); None = their total size

    def __post_init__(self) -> None:
        check_field_types(self, "DataConfig")
        if self.seq_len <= 0:
            raise ValueError(f"DataConfig.seq_len={self.seq_len}: must be positive")
        if self.num_workers < 0:
            raise ValueError(f"DataConfig.num_workers={self.num_workers}: must be >= 0")
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"DataConfig.overlong={self.overlong!r}: expected one of {OVERLONG_POLICIES}")
        if self.pack_order not in PACK_ORDERS:
            raise ValueError(f"DataConfig.pack_order={self.pack_order!r}: expected one of {PACK_ORDERS}")
        if self.num_codebooks is not None and self.num_codebooks <= 0:
            raise ValueError(f"DataConfig.num_codebooks={self.num_codebooks}: must be positive")
        if self.samples_per_epoch is not None and self.samples_per_epoch <= 0:
            raise ValueError(f"DataConfig.samples_per_epoch={self.samples_per_epoch}: must be positive or null")
        if not 0.0 <= self.val_noise_t <= 1.0:
            raise ValueError(f"DataConfig.val_noise_t={self.val_noise_t}: must lie in [0, 1]")
        self.sources = [source_spec(s, i) for i, s in enumerate(self.sources)]
        for s in self.sources:
            if not s.weight > 0:
                raise ValueError(f"DataConfig.sources[{s.name!r}].weight={s.weight}: must be positive")


def source_spec(value: Any, index: int) -> SourceSpec:
    """The `index`-th entry of DataConfig.sources as a SourceSpec (a mapping of its fields)."""
    if isinstance(value, SourceSpec):
        return value
    known = {f.name for f in fields(SourceSpec)}
    if not isinstance(value, dict) or "name" not in value or set(value) - known:
        raise ValueError(f"DataConfig.sources[{index}]={value!r}: expected a mapping with a name and only the keys "
                         f"{sorted(known)}")
    return SourceSpec(**value)


class PackCursorCallback(L.Callback):
    """Advances the pack cursor once per finished training step (runs before checkpoint callbacks)."""

    def __init__(self, schedule: PackSchedule) -> None:
        self.schedule = schedule

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.schedule.consumed()


class MixtureLogCallback(L.Callback):
    """Logs a mixture's realised source proportions of each epoch as `data/mix/<source>` (rank 0)."""

    def __init__(self, source: MixtureSource) -> None:
        self.source = source

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and trainer.logger is not None:
            trainer.logger.log_metrics(self.source.mix(trainer.current_epoch).log_dict(), step=trainer.global_step)


class LuminaDataModule(L.LightningDataModule):
    """Train / validation loaders of collated packs (B = 1, `batch_size=None`), one stream per DP rank."""

    def __init__(self, config: DataConfig, train_source: PackSource,
                 val_source: PackSource | None = None, assets: DatasetAssets | None = None) -> None:
        super().__init__()
        if config.pad_id is None or config.num_codebooks is None:
            raise ValueError(f"DataConfig.pad_id={config.pad_id}, num_codebooks={config.num_codebooks}: resolve them "
                             "from the data first (lumina.training.data_factory does)")
        self.config = config
        self.train_source, self.val_source = train_source, val_source
        self.assets = assets  # the tokenizers the data records (copied into the HF export)
        self.schedule = PackSchedule(train_source.lengths, config.seq_len, config.seed,
                                     config.overlong, train_source.sample_id,  # type: ignore[arg-type]
                                     order=config.pack_order)  # type: ignore[arg-type]
        self.cursor_callback = PackCursorCallback(self.schedule)
        self.mixture_callback = (MixtureLogCallback(train_source) if isinstance(train_source, MixtureSource)
                                 else None)
        self.sampler = PackSampler(self.schedule, epoch_fn=self._trainer_epoch)

    @property
    def rank(self) -> int:
        return self.schedule.rank

    @property
    def world_size(self) -> int:
        return self.schedule.world_size

    def setup(self, stage: str) -> None:
        """Take the DP rank / size from the trainer's strategy, install the callbacks (no trainer: 0 of 1)."""
        trainer = self.trainer
        if trainer is None:
            return
        layout = getattr(trainer.strategy, "distributed_sampler_kwargs", None) or {
            "num_replicas": trainer.world_size, "rank": trainer.global_rank}
        self.schedule.set_rank(layout["rank"], layout["num_replicas"])
        connector = getattr(trainer, "_accelerator_connector", None)
        if getattr(connector, "use_distributed_sampler", False):
            raise ValueError("LuminaDataModule deals packs to ranks itself; build the Trainer with "
                             "use_distributed_sampler=False (got True)")
        if not any(cb is self.cursor_callback for cb in trainer.callbacks):
            trainer.callbacks.insert(0, self.cursor_callback)
        if self.mixture_callback is not None and self.mixture_callback not in trainer.callbacks:
            trainer.callbacks.append(self.mixture_callback)

    def _trainer_epoch(self) -> int:
        """The epoch the trainer is about to run (what Lightning passes to `set_epoch`), else the sampler's."""
        trainer = self.trainer
        if trainer is None:
            return self.sampler._epoch
        return trainer.fit_loop.epoch_progress.current.processed

    def _loader(self, dataset: PackedDataset, sampler: Any) -> DataLoader:
        cfg = self.config
        workers = cfg.num_workers
        return DataLoader(dataset, sampler=sampler, batch_size=None, collate_fn=identity, num_workers=workers,
                          persistent_workers=cfg.persistent_workers and workers > 0,
                          prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
                          pin_memory=self._pin_memory())

    def _pin_memory(self) -> bool:
        """data.pin_memory, or (null) whether the trainer runs on CUDA: pinned pages only help a GPU copy."""
        if self.config.pin_memory is not None:
            return self.config.pin_memory
        trainer = self.trainer
        root = getattr(getattr(trainer, "strategy", None), "root_device", None)
        return root is not None and root.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        cfg = self.config
        dataset = PackedDataset(self.train_source, cfg.seq_len, cfg.pad_id, cfg.num_codebooks)
        return self._loader(dataset, self.sampler)

    def val_dataloader(self) -> DataLoader | list:
        """The held-out source, planned once (epoch 0, `val_seed`), dealt over the ranks; [] without one."""
        if self.val_source is None:
            return []
        cfg = self.config
        plan = plan_epoch(self.val_source.lengths(0), cfg.seq_len, cfg.val_seed, 0, cfg.overlong,
                          self.val_source.sample_id, cfg.pack_order)  # type: ignore[arg-type]
        packs = deal(plan.num_packs, 0, self.rank, self.world_size)
        dataset = PackedDataset(self.val_source, cfg.seq_len, cfg.pad_id, cfg.num_codebooks)
        return self._loader(dataset, FixedSampler(keys_for(plan, packs)))

    def steps_left(self) -> int:
        """Training steps every rank still runs in the epoch in progress."""
        return steps_left(self.schedule.plan().num_packs, self.schedule.cursor, self.world_size)

    def export_assets(self, directory: str | Path) -> list[Path]:
        """Copy the data's tokenizers into `directory` (an HF export): tokenizer.json, visual_tokenizer/."""
        return [] if self.assets is None else copy_assets(self.assets, directory)

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "schedule" not in state_dict:
            raise ValueError(f"LuminaDataModule state lacks 'schedule'; got keys {sorted(state_dict)}")
        self.schedule.load_state_dict(state_dict["schedule"])
