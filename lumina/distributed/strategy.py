"""`FSDP2ExpertParallelStrategy`: Lightning's `ModelParallelStrategy` with lumina's meshes, parallel plan,
expert-parallel dispatcher, FSDP2 units, mesh-aware gradient clipping and hang proofing.

`setup` shards the model (built on meta by `configure_model` if it likes) with `parallelize`, loads
`init_from` into the shards (all but an adapter's parameters, which keep their init) and installs the
participation check before Lightning takes over. With sequence parallelism `batch_to_device` keeps each rank's
window of its group's pack.

DCP checkpoints leave out the frozen parameters when the strategy read them from `init_from` (an adapter's
base, `model.freeze`): they cannot change, and a resume reads them from `init_from` again. Such a checkpoint
holds the trainable parameters, the buffers (the expert bias) and the optimizer state only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from lumina.contract.batch import PackedBatch
from lumina.distributed.grad_norm import clip_grad_norm, total_grad_norm
from lumina.distributed.hf import full_state_dict, load_hf_sharded
from lumina.distributed.launch import cluster_environment
from lumina.distributed.mesh import Meshes, build_meshes
from lumina.distributed.parallel_config import ParallelConfig
from lumina.distributed.parallel_plan import PlanRule, parse_plan
from lumina.distributed.parallelize import parallelize
from lumina.distributed.participation import ParticipationTracker, tracked_modules
from lumina.distributed.sequence_parallel import SequenceShard

log = logging.getLogger(__name__)


class MeshAwarePrecision(Precision):
    """"32-true" precision plugin whose norm clipping handles gradients on several meshes."""

    def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: int | float) -> None:
        clip_grad_norm(self.main_params(optimizer), float(clip_val))


class FSDP2ExpertParallelStrategy(ModelParallelStrategy):
    """parallel: a ParallelConfig or its fields (Hydra); plan: rules (None = the official expert plan)."""

    strategy_name = "fsdp2_ep"

    def __init__(self, parallel: ParallelConfig | Mapping[str, Any] | None = None,
                 plan: Sequence[PlanRule | Mapping | str] | None = None, save_distributed_checkpoint: bool = True,
                 process_group_backend: str | None = None, **kwargs: Any) -> None:
        if isinstance(parallel, Mapping):
            parallel = ParallelConfig.from_mapping(dict(parallel))
        self.parallel = parallel or ParallelConfig()
        self.rules = parse_plan(plan)
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend,
                         timeout=timedelta(seconds=self.parallel.timeout_s), **kwargs)
        self.meshes: Meshes | None = None
        self.participation: ParticipationTracker | None = None
        self.loaded_init_from: str | None = None  # set when `setup` read an HF checkpoint into the shards
        self.sequence_shard: SequenceShard | None = None  # this rank's window of a pack (sp > 1)
        self.materialises_model = True  # LightningModules may build on meta and leave init to `setup`
        environment = cluster_environment()
        if environment is not None:  # under submitit: submitit owns preemption / requeue
            self.cluster_environment = environment

    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)
        self._setup_distributed()
        sizes = self.parallel.resolve(self.world_size)
        self.meshes = build_meshes(sizes, self.root_device.type)
        self._device_mesh = self.meshes.dense
        self.lightning_module._device_mesh = self.meshes.dense

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """The sp ranks of a sequence-parallel group share one data-parallel replica."""
        sp = self.parallel.sp
        return {"num_replicas": self.world_size // sp, "rank": self.global_rank // sp}

    @property
    def dp_process_group(self) -> dist.ProcessGroup | None:
        """The group of the global token normalisation: the world (sp ranks hold disjoint rows)."""
        return None

    @property
    def sp_process_group(self) -> dist.ProcessGroup | None:
        """The ranks that share this rank's pack (None without sequence parallelism)."""
        sequence = self.meshes.sequence if self.meshes is not None else None
        return sequence.get_group("sp") if sequence is not None else None

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move the batch; with sequence parallelism keep this rank's window of the pack's rows."""
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if self.sequence_shard is not None and isinstance(batch, PackedBatch):
            batch = self.sequence_shard.local(batch)
        return batch

    def setup(self, trainer: L.Trainer) -> None:
        if type(self.precision_plugin) is not Precision:
            raise ValueError(f"trainer.precision={trainer.precision!r}: {type(self).__name__} needs '32-true' "
                             f"(got the {type(self.precision_plugin).__name__} plugin); mixed precision comes from "
                             "strategy.parallel.param_dtype (FSDP2 MixedPrecisionPolicy), never also autocast")
        self.precision_plugin = MeshAwarePrecision()
        self._check_run_dirs(trainer)
        module = self.lightning_module
        model = getattr(module, "model", None)
        if model is None:
            raise TypeError(f"{type(self).__name__}: the LightningModule has no `model` after configure_model()")
        if not isinstance(model, FSDPModule):  # a later fit/validate call reuses the sharded model
            self.parallelize_model(model, init_from=getattr(module, "init_from", None),
                                   adapter=getattr(module, "adapter_names", ()))
        super().setup(trainer)

    def parallelize_model(self, model: nn.Module, init_from: str | None = None,
                          adapter: Sequence[str] = ()) -> None:
        """Shard `model` in place (see module docstring); load `init_from` if the model arrived on meta, all
        but the parameters named in `adapter`."""
        assert self.meshes is not None, "setup_environment() must run first"
        on_meta = any(t.is_meta for t in model.parameters())
        cfg = self.parallel
        conditional = tracked_modules(model.conditional_modules())
        parallelize(model, self.meshes, cfg, self.rules, self.root_device)
        if cfg.sp > 1:
            self.sequence_shard = SequenceShard(self.global_rank % cfg.sp, cfg.sp, model.config.pad_token_id)
        if on_meta and init_from is not None:
            load_hf_sharded(model, init_from, adapter)
            self.loaded_init_from = init_from
        if cfg.participation_check:
            self.participation = ParticipationTracker(model, conditional)

    def _check_run_dirs(self, trainer: L.Trainer) -> None:
        """Every rank must write under the same run directory (pin hydra.run.dir for multi-process runs)."""
        dirs: list[Any] = [None] * self.world_size
        dist.all_gather_object(dirs, str(trainer.default_root_dir))
        if len(set(dirs)) > 1:
            raise ValueError(f"ranks resolved different run directories {sorted(set(dirs))}; pin "
                             "hydra.run.dir=<dir> on the command line of every rank")
        log.info(f"all {self.world_size} ranks write under the run directory {dirs[0]}")

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        if self.participation is not None:
            self.participation.check()

    def grad_norm(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """Total gradient 2-norm over both meshes (what clipping uses; equal on every rank)."""
        return total_grad_norm(parameters)

    @property
    def state_dict_options(self) -> StateDictOptions:
        """What a DCP checkpoint holds: no frozen parameter where `setup` read them from `init_from`."""
        return StateDictOptions(cpu_offload=True, ignore_frozen_params=self.loaded_init_from is not None)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if not self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        return get_model_state_dict(self.model, options=self.state_dict_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """DCP resume of the tensors `state_dict_options` keeps (the others came from `init_from`) and the
        optimizer states; the metadata file (with lumina's RNG record) is unpickled unless weights_only. A
        checkpoint without the frozen parameters needs the run's `init_from` (ValueError otherwise)."""
        path = Path(self.broadcast(checkpoint_path))
        weights_only = False if weights_only is None else weights_only
        if not path.is_dir():  # a consolidated single-file checkpoint: Lightning's own path
            return super().load_checkpoint(path, weights_only=weights_only)
        options = self.state_dict_options
        model_state = {"state_dict": get_model_state_dict(self.model, options=options)}
        self._check_holds(path, model_state["state_dict"])
        dcp.load(model_state, checkpoint_id=path)
        set_model_state_dict(self.model, model_state["state_dict"], options=StateDictOptions(strict=False))
        for index, optimizer in enumerate(self.optimizers):
            key = f"optimizer_{index}"
            optimizer_state = {key: get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(optimizer_state, checkpoint_id=path)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=optimizer_state[key], options=options)
        return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)

    def _check_holds(self, path: Path, state: dict[str, Any]) -> None:
        """ValueError naming init_from when the checkpoint lacks tensors this run needs from it."""
        stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        missing = [key for key in state if f"state_dict.{key}" not in stored]
        if not missing:
            return
        recorded = torch.load(path / _METADATA_FILENAME, weights_only=False).get("hyper_parameters", {})
        raise ValueError(f"checkpoint {str(path)!r} holds no {missing[0]!r} ({len(missing)} tensors missing): it "
                         "keeps only what trains, the frozen base comes from model.init_from "
                         f"(this run: {self.loaded_init_from!r}; the checkpoint's run: "
                         f"{recorded.get('init_from')!r}); resume with that model.init_from")

    def consolidated_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Full weights on CPU on rank 0, empty elsewhere (a collective: every rank must call it)."""
        return full_state_dict(model)
