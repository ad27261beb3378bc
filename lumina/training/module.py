"""`LuminaModule`: the LightningModule that trains a `LuminaModel` with the `LuminaObjective`.

Per micro-batch: forward -> objective -> backward (Lightning). Per optimizer step: gradient clipping
(Trainer), AdamW + warmup/cosine, the expert-bias update, and one set of logged scalars aggregated over the
step's micro-batches and the data-parallel ranks (losses, supervised tokens, tokens/s, lr, grad norm,
text / per-codebook accuracy, peak memory: the max over ranks).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lumina.adapters import ADAPTERS, Adapter
from lumina.checkpoint.model_factory import build_model
from lumina.checkpoint.official_parts import OFFICIAL_PART_FIELDS
from lumina.contract.batch import PackedBatch
from lumina.model import LuminaModel
from lumina.model.activation_checkpointing import apply_checkpointing
from lumina.model.compile import apply_compile, compiled_graphs
from lumina.model.config import LuminaConfig
from lumina.objective import LuminaObjective, ObjectiveConfig, ObjectiveResult, expert_load
from lumina.objective.held_out import scored_targets
from lumina.post_training.mode import PostTraining
from lumina.schedules import build_schedule
from lumina.training.memory import peak_memory_gib
from lumina.training.metrics import TokenAccuracies
from lumina.training.optim import OptimConfig, build_optimizer, build_scheduler
from lumina.training.trainable import mark_trainable


class LuminaModule(L.LightningModule):
    """model_config: the architecture; init_from: an HF directory whose weights are loaded in
    `configure_model` (None = fresh init); freeze: parameter-name globs kept frozen and out of the optimizer;
    meta_init: build on the meta device first, then materialise (what a sharding strategy needs); compile:
    `torch.compile` the decoder layers and the channel head (`lumina.model.compile.apply_compile`) and log
    `compile/graphs`, the graphs compiled so far in this process, every step; adapter: the adapter part
    (`lumina.adapters`, {"name": ..., options}; None = "none"), applied before checkpointing, compile and
    sharding; when it freezes the base only its parameters train and the expert bias must not update."""

    def __init__(self, model_config: LuminaConfig, objective: ObjectiveConfig | None = None,
                 optim: OptimConfig | None = None, init_from: str | None = None,
                 freeze: Sequence[str] = (), meta_init: bool = False, compile: bool = False,
                 adapter: dict[str, Any] | None = None, post_training: PostTraining | None = None) -> None:
        super().__init__()
        self.model_config = model_config
        self.optim_config = optim or OptimConfig()
        self.init_from = init_from
        self.freeze_globs = list(freeze)
        self.meta_init = meta_init
        self.compile = compile
        self.objective = LuminaObjective(objective or ObjectiveConfig(),
                                         schedule=build_schedule(model_config.masking_schedule))
        self.adapter_config = dict(adapter or {"name": "none"})
        self.adapter = build_adapter(self.adapter_config)
        if self.adapter.freezes_base and self.objective.config.balance.bias_update:
            raise ValueError(f"adapter.name={self.adapter_config['name']!r} freezes the base, expert bias "
                             "included: set objective.balance.bias_update=false")
        self.save_hyperparameters({
            "model": _plain(model_config), "objective": _plain(self.objective.config),
            "optim": _plain(self.optim_config), "init_from": init_from, "freeze": self.freeze_globs,
            "adapter": self.adapter_config,
        })
        self.model: torch.nn.Module | None = None
        self.frozen_names: list[str] = []
        self.adapter_names: list[str] = []  # the parameters the adapter added (`configure_model`)
        sizes = (model_config.vocab_size, model_config.codebook_size, model_config.num_codebooks)
        self.train_acc = TokenAccuracies(*sizes)
        self.val_acc = TokenAccuracies(*sizes)
        # per-optimizer-step bookkeeping (local to this rank)
        self._step_sums: dict[str, torch.Tensor] = {}
        self._step_micro = 0
        self._step_t0: float | None = None
        self._grad_norm: torch.Tensor | None = None
        self._step_lr = 0.0
        self.step_completed = False  # true between an optimizer step and the end of its batch hooks
        self.last_step_expert_load: torch.Tensor | None = None  # [L, E] counts of the last optimizer step
        self._expert_load_accum: torch.Tensor | None = None
        self.loss_history: list[float] = []  # train/loss per optimizer step (this process)
        self._resumed_rng: dict[str, Any] | None = None  # a checkpoint's RNG state, until the next train batch
        # post-training mode (objective.post_training): rollouts + a loss term instead of the supervised loss;
        # its reference model is the adapter's base view (`Adapter.base_view`: LoRA with its adapters off) or
        # else `reference`, a frozen copy of the starting weights (in checkpoints)
        self.post_training = post_training
        self.reference: torch.nn.Module | None = None
        self._rl_sums: dict[str, torch.Tensor] = {}

    # ---- model ----
    def configure_model(self) -> None:
        """Build the model once (a strategy may call this inside its sharding context), apply the adapter and
        the activation-checkpointing policy (`model_config.gradient_checkpointing`). A strategy with
        `materialises_model` gets it on the meta device, shards it afterwards and initialises / loads
        `init_from` itself."""
        if self.model is not None:
            return
        strategy_inits = self._trainer is not None and getattr(self.trainer.strategy, "materialises_model", False)
        if strategy_inits:
            with torch.device("meta"):
                model = LuminaModel(self.model_config)
        else:
            model = build_model(self.model_config, init_from=self.init_from, meta_init=self.meta_init,
                                device=self.device)
        adapter_params = self.adapter.apply(model)
        self.adapter_names = adapter_params  # not in init_from: a strategy loading it leaves these as initialised
        apply_checkpointing(model, self.model_config.gradient_checkpointing)
        trainable = mark_trainable(model, self.freeze_globs, self.adapter.trainable(model, adapter_params))
        self.frozen_names = [name for name, _ in model.named_parameters() if name not in trainable]
        self.objective.configure_routers(model)  # training-mode selection noise (objective.balance)
        if self.compile:  # after checkpointing, before the strategy shards the layers
            apply_compile(model)
        self.model = model
        if (self.post_training is not None and self.post_training.needs_reference()
                and self.adapter.base_view(model) is None):
            if strategy_inits:
                raise ValueError("objective.post_training: a loss term with a reference model under a sharding "
                                 "strategy (strategy=fsdp_ep) needs an adapter whose base is the reference "
                                 "(adapter=lora without modules_to_save); or train on one device")
            self.reference = frozen_copy(model)

    def forward(self, batch: PackedBatch):
        return self.model(batch)

    def setup(self, stage: str) -> None:
        group = getattr(self.trainer.strategy, "dp_process_group", None)
        self.objective.group = group  # token counts and expert-bias counts
        self.objective.sequence_group = getattr(self.trainer.strategy, "sp_process_group", None)
        self.train_acc.set_process_group(group)
        self.val_acc.set_process_group(group)

    # ---- steps ----
    def _objective(self, batch: PackedBatch) -> ObjectiveResult:
        """Forward + objective (the result also carries the predictions and targets for the accuracies)."""
        return self.objective(self.model(batch), batch)

    def training_step(self, batch: PackedBatch, batch_idx: int) -> torch.Tensor:
        if self.post_training is not None:
            return self._post_training_step(batch, batch_idx)
        result = self._objective(batch)
        self.train_acc.update(result.text_preds, result.text_targets, result.image_preds, result.image_targets)
        self._accumulate(result, batch)
        return result.loss

    def validation_step(self, batch: PackedBatch, batch_idx: int) -> torch.Tensor:
        result = self._objective(batch)
        self.val_acc.update(result.text_preds, result.text_targets, result.image_preds, result.image_targets)
        # the held-out loss rule (`HeldOutLoss`): Lightning's epoch mean weighted by the scored targets
        log = dict(on_step=False, on_epoch=True, sync_dist=True)
        cells = max(result.image_targets.shape[0], 1)
        self.log("val/loss", result.loss.detach(), prog_bar=True, batch_size=max(scored_targets(result), 1), **log)
        self.log("val/text_loss", result.text_loss, batch_size=max(result.text_targets.numel(), 1), **log)
        self.log("val/image_loss", result.image_loss, batch_size=max(result.image_targets.numel(), 1), **log)
        for c, value in enumerate(result.image_loss_per_codebook):
            self.log(f"val/image_loss/cb{c}", value, batch_size=cells, **log)
        return result.loss

    def on_validation_epoch_end(self) -> None:
        for name, value in self.val_acc.compute().items():
            metric = self.val_acc.text if name == "text_acc" else self.val_acc.codebooks[0]
            if metric.update_count > 0:  # skip modalities the validation set lacks
                self.log(f"val/{name}", value, on_step=False, on_epoch=True)
        self.val_acc.reset()

    # ---- per-optimizer-step bookkeeping ----
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._resumed_rng is not None:  # see on_load_checkpoint
            _set_rng_state(self._resumed_rng, self.device)
            self._resumed_rng = None
        if self._step_t0 is None:
            self._step_t0 = time.perf_counter()

    def _accumulate(self, result: ObjectiveResult, batch: PackedBatch) -> None:
        values = {
            "loss": result.loss.detach(), "text_loss": result.text_loss, "image_loss": result.image_loss,
            "balance_loss": result.balance_loss, "image_loss_cb": result.image_loss_per_codebook,
            "text_tokens": result.num_text_global, "image_tokens": result.num_image_global,
            "tokens": batch.token_valid.sum(),
        }
        for key, value in values.items():
            value = value.detach().to(torch.float64)
            self._step_sums[key] = self._step_sums[key] + value if key in self._step_sums else value
        load = result.expert_load.detach().to(torch.float64)
        self._expert_load_accum = load if self._expert_load_accum is None else self._expert_load_accum + load
        self._step_micro += 1

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The total gradient 2-norm before clipping (a sharding strategy computes it across its meshes)."""
        params = [p for p in self.parameters() if p.grad is not None]
        strategy_norm = getattr(self.trainer.strategy, "grad_norm", None)
        if strategy_norm is not None:
            self._grad_norm = strategy_norm(params)
        elif params:
            self._grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))
        else:
            self._grad_norm = torch.zeros((), device=self.device)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        self._step_lr = optimizer.param_groups[0]["lr"]  # what this step applies (the scheduler steps after)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self.objective.on_optimizer_step(self.model)  # expert-bias update, once per optimizer step
        self.last_step_expert_load = self._expert_load_accum
        self._expert_load_accum = None
        self.step_completed = True

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.step_completed:
            return
        self.step_completed = False
        if self.post_training is not None:
            self._log_post_training_step()
            return
        elapsed = time.perf_counter() - (self._step_t0 or time.perf_counter())
        sums, micro = self._step_sums, self._step_micro
        self._step_sums, self._step_micro, self._step_t0 = {}, 0, None
        # losses: mean over micro-batches, then over ranks; token counts are already global (text/image),
        # the processed-token count is summed over ranks.
        means = torch.cat([torch.stack([sums[k] for k in ("loss", "text_loss", "image_loss", "balance_loss")]),
                           sums["image_loss_cb"]]) / micro
        means = self.trainer.strategy.reduce(means, reduce_op="mean")
        tokens = self.trainer.strategy.reduce(sums["tokens"], reduce_op="sum")
        loss, text_loss, image_loss, balance_loss = means[:4].tolist()
        self.loss_history.append(loss)
        scalars = {
            "train/loss": loss, "train/text_loss": text_loss, "train/image_loss": image_loss,
            "train/balance_loss": balance_loss,
            "train/text_tokens": sums["text_tokens"].item(), "train/image_tokens": sums["image_tokens"].item(),
            "train/supervised_tokens": (sums["text_tokens"] + sums["image_tokens"]).item(),
            "train/tokens_per_sec": tokens.item() / max(elapsed, 1e-9),
            "train/lr": self._step_lr,
        }
        scalars.update({f"train/image_loss/cb{c}": v for c, v in enumerate(means[4:].tolist())})
        if self._grad_norm is not None:
            scalars["train/grad_norm"] = self._grad_norm.item()
        scalars["train/peak_mem_gib"] = self._peak_mem_gib()
        if self.compile:
            scalars["compile/graphs"] = compiled_graphs()
        for name, value in self.train_acc.compute().items():  # only accuracies with tokens in this step
            if sums["text_tokens" if name == "text_acc" else "image_tokens"] > 0:
                scalars[f"train/{name}"] = value.item()
        self.train_acc.reset()
        self.log_dict(scalars, on_step=True, on_epoch=False, batch_size=1)
        self.log("loss", loss, prog_bar=True, logger=False, on_step=True, batch_size=1)

    # ---- post-training mode (lumina.post_training) ----
    def _post_training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        micro = batch_idx % self.trainer.accumulate_grad_batches
        reference = None
        if self.post_training.needs_reference():
            reference = self.adapter.base_view(self.model) if self.reference is None else nullcontext(self.reference)
        loss, metrics = self.post_training.step(self.model, reference, batch, self.global_step, micro,
                                                group=self.objective.group, on_output=self._post_training_output)
        for key, value in {"loss": loss.detach(), **metrics}.items():
            value = value.detach().to(torch.float64)
            self._rl_sums[key] = self._rl_sums[key] + value if key in self._rl_sums else value
        self._step_micro += 1
        return loss

    def _post_training_output(self, output: Any, batch: PackedBatch) -> None:
        """Every scoring forward's expert load: the expert-usage logging and, if asked, the expert-bias update."""
        num_experts = output.router_logits[0].shape[-1] if output.router_logits else 0
        load = expert_load(output.router_topk_ids, batch.token_valid, num_experts)
        if self.objective.config.balance.bias_update:
            self.objective.bias_updater.accumulate(load)
        load = load.detach().to(torch.float64)
        self._expert_load_accum = load if self._expert_load_accum is None else self._expert_load_accum + load

    def _log_post_training_step(self) -> None:
        sums, micro = self._rl_sums, self._step_micro
        self._rl_sums, self._step_micro, self._step_t0 = {}, 0, None
        # the loss is this rank's share (the ranks' mean is the global loss); the metrics are already global
        loss = self.trainer.strategy.reduce(sums.pop("loss") / micro, reduce_op="mean").item()
        self.loss_history.append(loss)
        scalars = {"train/loss": loss, "train/lr": self._step_lr, "train/peak_mem_gib": self._peak_mem_gib()}
        if self._grad_norm is not None:
            scalars["train/grad_norm"] = self._grad_norm.item()
        scalars.update({f"rl/{key}": (value / micro).item() for key, value in sums.items()})
        self.log_dict(scalars, on_step=True, on_epoch=False, batch_size=1)
        self.log("loss", loss, prog_bar=True, logger=False, on_step=True, batch_size=1)

    def _peak_mem_gib(self) -> float:
        """This process's peak memory on its device (GiB; CUDA allocator peak, else peak RSS), max over ranks."""
        peak = torch.tensor(peak_memory_gib(self.device), dtype=torch.float64, device=self.device)
        return self.trainer.strategy.reduce(peak, reduce_op="max").item()

    # ---- optimisation ----
    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim_config)
        scheduler = build_scheduler(optimizer, self.optim_config, self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- exact resume: RNG state travels with the checkpoint ----
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lumina_rng"] = rng_state(self.device)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_rng = checkpoint.get("lumina_rng")
        step = checkpoint.get("global_step", 0)
        if self.post_training is not None and not self.post_training.config.resumes_exactly_at(step):
            rank_zero_warn(f"resuming at optimizer step {step}, inside a rollout cycle of objective.post_training."
                           f"inner_epochs={self.post_training.config.inner_epochs}: that cycle is rolled out again "
                           "with the resumed weights, so the run does not continue exactly as it would have")
        # a run goes on with the parts it started with (the schedule has no weights, so only this check sees it);
        # a checkpoint from before a part was chosen by name (issue 41) lacks the key and used the official part
        trained_adapter = checkpoint.get("hyper_parameters", {}).get("adapter", {"name": "none"})
        if trained_adapter != self.adapter_config:
            raise ValueError(f"adapter={self.adapter_config}: the checkpoint was trained with adapter="
                             f"{trained_adapter}; resume with that adapter")
        saved = checkpoint.get("hyper_parameters", {}).get("model", {})
        defaults = {f.name: f.default for f in dataclasses.fields(LuminaConfig)}
        for field, _ in OFFICIAL_PART_FIELDS:
            trained, now = saved.get(field, defaults[field]), getattr(self.model_config, field)
            if trained != now:
                raise ValueError(f"model.config.{field}={now!r}: the checkpoint was trained with {trained!r}; "
                                 f"resume with model.config.{field}={trained}")


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with every parameter frozen, in eval mode (a post-training reference)."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference.eval()


def build_adapter(config: dict[str, Any]) -> Adapter:
    """The adapter part config {"name": NAME, **options} names (`lumina.adapters.ADAPTERS`); a bad name or
    option is a ValueError naming the field."""
    options = dict(config)
    name = options.pop("name", "none")
    cls = ADAPTERS.get(name, "adapter.name")
    try:
        return cls(**options)
    except TypeError as error:
        raise ValueError(f"adapter: {error} (options of adapter {name!r}: {sorted(options)})") from None


@dataclasses.dataclass(frozen=True)
class DeviceRNG:
    """An accelerator's generator, as its state getter and setter (a ByteTensor state)."""

    get: Callable[[], torch.Tensor]
    set: Callable[[torch.Tensor], None]


def device_rng(device: torch.device) -> DeviceRNG | None:
    """The generator of `device` when it is a CUDA device (the routers' selection noise is drawn there on a
    GPU), else None."""
    if device.type != "cuda":
        return None
    return DeviceRNG(functools.partial(torch.cuda.get_rng_state, device),
                     functools.partial(torch.cuda.set_rng_state, device=device))


def rng_state(device: torch.device) -> dict[str, Any]:
    """The record of every generator training draws from (torch's CPU one, `device_rng(device)`, numpy's,
    Python's), in tensors and plain values (`torch.load(weights_only=True)` reads it). `LuminaModule` restores
    it at the first resumed batch: creating the DataLoader's iterator after the load draws from them too."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    rng = device_rng(device)
    if rng is not None:
        state["cuda"] = rng.get()
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore `rng_state`'s record."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(state["python"])
    rng = device_rng(device)
    if rng is not None and "cuda" in state:  # a record saved on CPU has none
        rng.set(state["cuda"])


def _plain(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
