"""One gloo rank of the distributed tests: `python dist_worker.py <scenario> <out_dir>` (env:// rendezvous).

Scenarios write `out_dir/<name>.rank<r>.pt`; each is a function below. "core" runs every check that needs no
Lightning Trainer and then the Lightning runs that share one healthy process group; "hang" ends in a
collective failure on purpose and so runs alone."""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from dist_helpers import FEW, MANY, TEXT_THEN_IMAGE, block_pack, expert_load, make_pack, tiny_config, union
from seed_strategy import SeedStrategy
from torch.utils.data import DataLoader

from lumina.adapters import LoRAGroupedExperts
from lumina.checkpoint import save_pretrained
from lumina.distributed import (
    AllToAllDispatcher,
    FSDP2ExpertParallelStrategy,
    ParallelConfig,
    ParticipationTracker,
    build_meshes,
    clip_grad_norm,
    full_state_dict,
    load_hf_sharded,
    parallelize,
    total_grad_norm,
    tracked_modules,
)
from lumina.distributed.parallel_plan import OFFICIAL_PLAN
from lumina.distributed.sequence_parallel import SequenceShard
from lumina.model import LuminaModel
from lumina.model.activation_checkpointing import RoutingTape, apply_checkpointing
from lumina.model.compile import apply_compile
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

OUT: Path = Path(".")

RANK = 0


def export_hf(model: torch.nn.Module, directory: Path) -> None:
    """Every rank gathers the consolidated weights; rank 0 writes them as an HF directory (split layout)."""
    state = full_state_dict(model)
    if dist.get_rank() == 0:
        save_pretrained(state, directory, config=model.config, overwrite=True)


def save(name: str, value: object) -> None:
    torch.save(value, OUT / f"{name}.rank{RANK}.pt")


def fresh_model(seed: int = 0, **overrides) -> LuminaModel:
    torch.manual_seed(seed)
    return LuminaModel(tiny_config(**overrides))


def sharded(model: LuminaModel, ep: int = 2, **flags) -> LuminaModel:
    cfg = ParallelConfig(ep=ep, **flags)
    meshes = build_meshes(cfg.resolve(dist.get_world_size()), "cpu")
    parallelize(model, meshes, cfg, OFFICIAL_PLAN, torch.device("cpu"))
    return model


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters() if p.grad is not None}


def objective(sequence_group=None) -> LuminaObjective:
    return LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)), sequence_group=sequence_group)


def my_pack():
    """Even ranks train FEW, odd ranks MANY (rank 0 / 1 of a 2-rank run)."""
    return make_pack(FEW if RANK % 2 == 0 else MANY, seed=10 + RANK % 2)


# ---------------------------------------------------------------- direct API checks
def parity() -> None:
    """EP=2 x FSDP=2: gradients, the clipping norm and the weights after one clipped SGD step."""
    model = sharded(fresh_model())
    tracker = ParticipationTracker(model, tracked_modules(model.conditional_modules()))
    batch = my_pack()
    dispatchers = [m.dispatcher for m in model.moe_layers()]
    syncs = dict.fromkeys(map(id, dispatchers), 0)
    read_splits = AllToAllDispatcher.splits

    def counted(self: AllToAllDispatcher, counts: torch.Tensor):  # noqa: ANN202 - the host read of split sizes
        syncs[id(self)] += 1
        return read_splits(self, counts)

    AllToAllDispatcher.splits = counted
    try:
        output = model(batch)
        result = objective()(output, batch)
    finally:
        AllToAllDispatcher.splits = read_splits
    tracker.check()
    result.loss.backward()
    grads = full_grads(model)
    norm = total_grad_norm(model.parameters())
    clipped = clip_grad_norm(model.parameters(), max_norm=0.5 * float(norm))
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    host_syncs = [syncs[id(d)] for d in dispatchers]
    save("parity", {"grads": grads, "norm": norm, "clip_norm": clipped, "weights": full_state_dict(model, all_ranks=True),
                    "load": expert_load(output, model.config.num_experts), "host_syncs": host_syncs, "checks": tracker.checks})


def parity_layout(name: str, **flags) -> None:
    """Another 2-rank layout (EP=1 x expert-FSDP=2, or HSDP replicate=2): gradients and clipping norm."""
    model = sharded(fresh_model(), **flags)
    batch = my_pack()
    objective()(model(batch), batch).loss.backward()
    save(name, {"grads": full_grads(model), "norm": total_grad_norm(model.parameters()),
                "local_expert_rows": model.moe_layers()[0].experts.gate_proj.grad.to_local().shape[0]})


def checkpointing(policy: str) -> None:
    """Activation checkpointing (`policy`) with the backbone's routing replay: same expert load and gradients
    as without. Built as `LuminaModule.configure_model` builds for a sharding strategy: on the meta device,
    the policy applied, then sharded (and materialised unit by unit)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LuminaModel(tiny_config(gradient_checkpointing=policy))
    apply_checkpointing(model, policy)
    sharded(model)
    batch = my_pack()
    replayed, take = [0], RoutingTape.take

    def counted(tape: RoutingTape, ids: torch.Tensor) -> torch.Tensor:  # router calls served from a tape
        replayed[0] += tape.cursor is not None
        return take(tape, ids)

    RoutingTape.take = counted
    try:
        output = model(batch)
        objective()(output, batch).loss.backward()
    finally:
        RoutingTape.take = take
    save(f"checkpointing_{policy}", {"grads": full_grads(model), "load": expert_load(output, model.config.num_experts),
                                     "replayed": replayed[0]})


def mixed_precision() -> None:
    """FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce): fp32 master weights and gradients."""
    model = sharded(fresh_model(), param_dtype="bfloat16")
    batch = my_pack()
    objective()(model(batch), batch).loss.backward()
    dtypes = sorted({str(p.dtype) for p in model.parameters()} | {str(p.grad.dtype) for p in model.parameters()})
    save("mixed_precision", {"grads": full_grads(model), "dtypes": dtypes})


SEQUENCE_PACKS = {"union": lambda: union(make_pack(FEW, seed=10), make_pack(MANY, seed=11)),
                  "block": lambda: block_pack(seed=5)}


def sequence_parity(name: str, pack: str, ep: int, **overrides) -> None:
    """sp=2: both ranks share one pack (odd length, segments across the split), each holding half its rows;
    loss, gradients, clipping norm and the weights after one clipped SGD step (compared with one process)."""
    model = sharded(fresh_model(**overrides), ep=ep, sp=2)
    group = model.model.layers[0].attention.core.group
    batch = SequenceShard(dist.get_rank(group), 2, tiny_config().pad_token_id).local(SEQUENCE_PACKS[pack]())
    result = objective(group)(model(batch), batch)
    result.loss.backward()
    loss = result.loss.detach().clone()
    dist.all_reduce(loss)  # the ranks' mean is the logged loss
    grads = full_grads(model)
    norm = total_grad_norm(model.parameters())
    clipped = clip_grad_norm(model.parameters(), max_norm=0.5 * float(norm))
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    save(name, {"loss": loss / 2, "grads": grads, "norm": norm, "clip_norm": clipped, "rows": batch.seq_len,
                "weights": full_state_dict(model, all_ranks=True)})


def compiled_step(compiled: bool, sp: int, **overrides) -> dict:
    """One step of the EP=2 x FSDP=2 model (sp=2: both ranks share the union pack), compiled before sharding
    as `LuminaModule.configure_model` does, or eager: loss and full gradients."""
    model = fresh_model(**overrides)
    if compiled:
        apply_compile(model)
    model = sharded(model, sp=sp)
    group = model.model.layers[0].attention.core.group if sp > 1 else None
    batch = my_pack() if sp == 1 else SequenceShard(dist.get_rank(group), 2, tiny_config().pad_token_id).local(
        SEQUENCE_PACKS["union"]())
    loss = objective(group)(model(batch), batch).loss
    loss.backward()
    return {"loss": loss.detach(), "grads": full_grads(model)}


def compiled_runs() -> None:
    """Compiled and eager steps under FSDP2 + EP and under FSDP2 + EP + sequence parallelism (checkpointing
    with compile: tests/model/test_compile.py)."""
    runs = {"ep": {"sp": 1}, "ep_sp": {"sp": 2}}
    save("compile", {name: {mode: compiled_step(mode == "compiled", **kwargs) for mode in ("eager", "compiled")}
                     for name, kwargs in runs.items()})


def loaded_from_hf(hf_dir: str) -> LuminaModel:
    """Meta-initialised model, sharded over this world at EP=2, then the split HF checkpoint read into the shards."""
    with torch.device("meta"):
        model = LuminaModel(tiny_config())
    sharded(model)
    load_hf_sharded(model, hf_dir)
    return model


def hf_load(hf_dir: str) -> None:
    """The split HF checkpoint read into the shards at EP=2 / FSDP=2, then exported again."""
    model = loaded_from_hf(hf_dir)
    local_expert_rows = model.moe_layers()[0].experts.gate_proj.to_local().shape[0]
    save("hf_load", {"weights": full_state_dict(model, all_ranks=True), "local_expert_rows": local_expert_rows})
    export_hf(model, OUT / "hf_export")


def four_ranks(hf_dir: str) -> None:
    """4 ranks, EP=2 x expert-FSDP=2 (expert tensors Shard(0) on ep and FSDP2's _StridedShard on expert_fsdp):
    the split HF checkpoint read into a meta-initialised model, then one backward on this rank's pack."""
    model = loaded_from_hf(hf_dir)
    weights = full_state_dict(model, all_ranks=True)
    batch = my_pack()
    objective()(model(batch), batch).loss.backward()
    gate = model.moe_layers()[0].experts.gate_proj
    save("four", {"weights": weights, "grads": full_grads(model), "norm": total_grad_norm(model.parameters()),
                  "placements": [type(p).__name__ for p in gate.placements],
                  "local_expert_rows": gate.to_local().shape[0]})


def four_sequence() -> None:
    """4 ranks at sp=2 x ep=2: ranks 0, 1 share pack FEW, ranks 2, 3 pack MANY (data-parallel size 2)."""
    model = sharded(fresh_model(), ep=2, sp=2)
    group = model.model.layers[0].attention.core.group
    pack = make_pack(FEW, seed=10) if RANK < 2 else make_pack(MANY, seed=11)
    batch = SequenceShard(RANK % 2, 2, tiny_config().pad_token_id).local(pack)
    result = objective(group)(model(batch), batch)
    result.loss.backward()
    loss = result.loss.detach().clone()
    dist.all_reduce(loss)
    save("four_sequence", {"loss": loss / 4, "grads": full_grads(model), "norm": total_grad_norm(model.parameters()),
                           "sp_ranks": dist.get_process_group_ranks(group)})


# ---------------------------------------------------------------- Lightning runs
class FixedPacks(L.LightningDataModule):
    """Rank r trains pack `packs[r]` at every step."""

    def __init__(self, packs) -> None:
        super().__init__()
        self.packs = packs

    def train_dataloader(self) -> DataLoader:
        return DataLoader([self.packs[self.trainer.global_rank]] * 1000, batch_size=None, collate_fn=_identity)


def _identity(x):
    return x


def trainer(strategy, root: Path, steps: int, callbacks=(), every: int | None = None) -> L.Trainer:
    callbacks = list(callbacks)
    if every:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=every,
                                                             save_top_k=-1, filename="s{step}",
                                                             auto_insert_metric_name=False))
    return L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=steps, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(every),
                     use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0,
                     gradient_clip_val=1.0, callbacks=callbacks, default_root_dir=str(root))


def lumina_module():
    from lumina.training.module import LuminaModule
    from lumina.training.optim import OptimConfig

    torch.manual_seed(0)
    return LuminaModule(tiny_config(), objective=ObjectiveConfig(balance=BalanceConfig(bias_rate=0.01)),
                        optim=OptimConfig(lr=1e-3, warmup_steps=1))


def world_data():
    from lumina.training.data_factory import build_datamodule

    data = {"seq_len": 256, "seed": 0, "num_workers": 0, "pad_id": 0, "num_codebooks": 4,
            "sources": [{"name": "world", "weight": 1.0, "path": None, "options": {"num_samples": 32,
                                                                                   "val_samples": 4}}]}
    dm = build_datamodule(data, tiny_config())
    dm.schedule.plan()
    return dm


class Recorder(L.Callback):
    """Per step: loss, a digest of this rank's batch and the expert biases; at the steps in `at_steps` and at
    the end of training, the full weights."""

    def __init__(self, at_steps: tuple[int, ...] = ()) -> None:
        self.losses, self.batches, self.biases, self.at_steps, self.snapshots = [], [], [], at_steps, {}
        self.packs = []  # digest of the whole pack (a sequence-parallel rank's batch is a window of it)

    @staticmethod
    def snapshot(module) -> dict:
        return {"weights": full_state_dict(module.model, all_ranks=True),
                "bias": [m.gate.expert_bias.clone() for m in module.model.moe_layers()]}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        self.batches.append(hashlib.sha1(batch.input_ids.numpy().tobytes()).hexdigest())
        pack = batch.whole if batch.whole is not None else batch
        self.packs.append(hashlib.sha1(pack.input_ids.numpy().tobytes()).hexdigest())
        self.biases.append([m.gate.expert_bias.clone() for m in module.model.moe_layers()])
        if trainer.global_step in self.at_steps:
            self.snapshots[trainer.global_step] = self.snapshot(module)

    def on_train_end(self, trainer, module) -> None:
        self.snapshots["end"] = self.snapshot(module)

    def result(self) -> dict:
        return {"losses": self.losses, "batches": self.batches, "biases": self.biases,
                "snapshots": self.snapshots, "packs": self.packs}


def train_and_resume(name: str, parallel: ParallelConfig, reload: ParallelConfig) -> dict:
    """4 steps under `parallel` with DCP checkpoints every 2; resume from step 2 under `parallel`; load step 2
    under `reload` (max_steps=2: restores, trains nothing)."""
    root = OUT / name
    full = Recorder(at_steps=(2,))
    trainer(FSDP2ExpertParallelStrategy(parallel), root / "full", 4, [full], every=2).fit(
        lumina_module(), datamodule=world_data())
    ckpt = root / "full" / "ckpt" / "s2.ckpt"
    resumed = Recorder()
    trainer(FSDP2ExpertParallelStrategy(parallel), root / "resume", 4, [resumed]).fit(
        lumina_module(), datamodule=world_data(), ckpt_path=str(ckpt))
    module, data = lumina_module(), world_data()
    trainer(FSDP2ExpertParallelStrategy(reload), root / "reload", 2).fit(module, datamodule=data, ckpt_path=str(ckpt))
    reloaded = {**Recorder.snapshot(module), "step": module.trainer.global_step,
                "local_expert_rows": module.model.moe_layers()[0].experts.gate_proj.to_local().shape[0],
                "data_parallel": (data.rank, data.world_size)}
    return {"full": full.result(), "resumed": resumed.result(), "reloaded": reloaded, "ckpt": str(ckpt)}


def strategy_init_from(hf_dir: str) -> None:
    """The strategy path: LuminaModule(init_from=...) builds on meta, the strategy shards and reads the shards."""
    from lumina.training.module import LuminaModule
    from lumina.training.optim import OptimConfig

    module = LuminaModule(tiny_config(), init_from=hf_dir, optim=OptimConfig(decay_steps=10))
    packs = [make_pack(FEW, seed=1), make_pack(MANY, seed=2)]
    strategy = FSDP2ExpertParallelStrategy(ParallelConfig(ep=2))
    trainer(strategy, OUT / "init_from", 0).fit(module, datamodule=FixedPacks(packs))
    save("init_from", {"weights": full_state_dict(module.model, all_ranks=True),
                       "loaded_by_strategy": strategy.loaded_init_from == hf_dir})


def conditional_runs() -> None:
    """Rank 1's pack has no image targets. Rule on: trains; rule off + participation check: names modules."""
    packs = [make_pack([(3, 6, 4, 6, 5)], seed=1), make_pack([(4, 8, 6, 0, 0)], seed=2)]
    out = {}
    rec = Recorder()
    trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2)), OUT / "rule_on", 3, [rec]).fit(
        lumina_module(), datamodule=FixedPacks(packs))
    out["rule_on_losses"] = rec.losses
    try:
        trainer(SeedStrategy(ParallelConfig(ep=2)), OUT / "check", 3).fit(
            lumina_module(), datamodule=FixedPacks(packs))
        out["check_error"] = None
    except Exception as error:  # noqa: BLE001 - recorded for the test
        out["check_error"] = (type(error).__name__, str(error))
    save("conditional", out)


def hang() -> None:
    """Rule off, participation check off: the seed's run. Prints each phase (the process may be aborted by
    gloo itself) and records how it failed."""
    packs = [make_pack([(3, 6, 4, 6, 5)], seed=1), make_pack([(4, 8, 6, 0, 0)], seed=2)]
    phase = {"where": "setup"}

    def mark(where: str) -> None:
        phase["where"] = where
        print(f"PHASE {where} {time.monotonic():.3f}", flush=True)

    class Phase(L.Callback):
        def on_train_start(self, trainer, module):  # the timeout the strategy gave the process group
            timeout = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
            print(f"PG_TIMEOUT {timeout.total_seconds():.1f}", flush=True)

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            mark("forward")

        def on_before_backward(self, trainer, module, loss):
            mark("backward")

        def on_after_backward(self, trainer, module):
            mark("after_backward")

    cfg = ParallelConfig(ep=2, participation_check=False, timeout_s=15)
    mark("setup")
    try:
        trainer(SeedStrategy(cfg), OUT / "hang", 3, [Phase()]).fit(
            lumina_module(), datamodule=FixedPacks(packs))
        result = {"error": None}
    except BaseException as error:  # noqa: BLE001 - recorded for the test
        result = {"error": (type(error).__name__, str(error)[:2000]), "trace": traceback.format_exc()[-4000:]}
    print(f"RESULT {time.monotonic():.3f} {result['error']}", flush=True)
    result.update(where=phase["where"], timeout=cfg.timeout_s)
    save("hang", result)


class BatchFacts(L.Callback):
    """Per step: train/loss (the mean over ranks) and this rank's local rows, supervised image rows and
    participation checks."""

    def __init__(self) -> None:
        self.losses, self.rows, self.image_rows, self.checks = [], [], [], []

    def on_train_end(self, trainer, module) -> None:
        self.losses = list(module.loss_history)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.rows.append(batch.seq_len)
        self.image_rows.append(int(((batch.type_ids == 4) & (batch.labels[..., 0] != -100)).sum()))
        self.checks.append(trainer.strategy.participation.checks)


def sequence_runs() -> None:
    """Lightning at sp=2: a pack whose first half holds no image target trains, with the same losses as
    sp=1 where both ranks train the whole pack; world data with DCP checkpoints resumes at sp=2 and loads
    at sp=1 (ep=1)."""
    pack = make_pack(TEXT_THEN_IMAGE, seed=3)
    out = {}
    for sp in (2, 1):
        facts = BatchFacts()
        trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2, sp=sp)), OUT / f"sp{sp}_text_only", 3,
                [facts]).fit(lumina_module(), datamodule=FixedPacks([pack, pack]))
        out[f"sp{sp}"] = {"losses": facts.losses, "rows": facts.rows, "image_rows": facts.image_rows,
                          "checks": facts.checks}
    out["resume"] = train_and_resume("sp_resume", ParallelConfig(sp=2), ParallelConfig(sp=1))
    save("sequence_runs", out)


# ---------------------------------------------------------------- LoRA under FSDP2 + EP
LORA = {"name": "lora", "rank": 4, "alpha": 8, "modules_to_save": ["lm_head"]}


def lora_module(hf_dir: str | None, checkpointing: str = "none"):
    """The LoRA fine-tune every adapter run trains: rank 4 on the default targets and the text head trained
    whole (modules_to_save), base from `hf_dir` (None:
    the seed-0 init), activation checkpointing `checkpointing`."""
    from lumina.training.module import LuminaModule
    from lumina.training.optim import OptimConfig

    torch.manual_seed(0)
    return LuminaModule(tiny_config(gradient_checkpointing=checkpointing), init_from=hf_dir, objective=ObjectiveConfig(balance=BalanceConfig(
        bias_update=False)), optim=OptimConfig(lr=1e-2, warmup_steps=1), adapter=dict(LORA))


class GradRecorder(L.Callback):
    """Per optimizer step: the names of the parameters holding a gradient."""

    def __init__(self) -> None:
        self.with_grad: list[list[str]] = []

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.with_grad.append(sorted(n for n, p in module.model.named_parameters() if p.grad is not None))


def adapter_runs(hf_dir: str) -> None:
    """LoRA rank 4 under FSDP2 + EP=2 (rank 0 trains pack FEW, rank 1 MANY): 4 steps with a DCP checkpoint
    every 2 and the HF export; the step-2 checkpoint resumed at EP=2 and loaded at EP=1."""
    from lumina.training.hf_export import HFExportCallback

    packs = [make_pack(FEW, seed=10), make_pack(MANY, seed=11)]
    root = OUT / "lora"
    grads, export, snapshots = GradRecorder(), HFExportCallback(str(root / "hf")), Recorder(at_steps=(2,))
    module = lora_module(hf_dir)
    trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2)), root / "full", 4, [grads, export, snapshots],
            every=2).fit(
        module, datamodule=FixedPacks(packs))
    model = module.model
    experts = model.moe_layers()[0].experts
    factor = experts.lora_A["gate_proj"]
    optimizer = module.trainer.optimizers[0]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    ckpt = root / "full" / "ckpt" / "s2.ckpt"
    resumed = lora_module(hf_dir)
    trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2)), root / "resume", 4).fit(
        resumed, datamodule=FixedPacks(packs), ckpt_path=str(ckpt))
    reloaded = lora_module(hf_dir)
    trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=1)), root / "reload", 2).fit(
        reloaded, datamodule=FixedPacks(packs), ckpt_path=str(ckpt))
    checkpointed = lora_module(hf_dir, "full")
    trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2)), root / "checkpointed", 2).fit(
        checkpointed, datamodule=FixedPacks(packs))
    try:  # a checkpoint without the frozen base, resumed without the init_from that holds it
        trainer(FSDP2ExpertParallelStrategy(ParallelConfig(ep=2)), root / "no_base", 2).fit(
            lora_module(None), datamodule=FixedPacks(packs), ckpt_path=str(ckpt))
        no_base_error = None
    except ValueError as error:
        no_base_error = str(error)
    save("lora", {"no_base_error": no_base_error, "checkpointed_losses": checkpointed.loss_history,
        "losses": module.loss_history, "resumed_losses": resumed.loss_history, "with_grad": grads.with_grad,
        "adapter_names": module.adapter_names, "weights": full_state_dict(model, all_ranks=True),
        "optimizer_params": sorted(n for n, p in model.named_parameters() if id(p) in in_optimizer),
        "optimizer_states": len(optimizer.state), "lora_experts": isinstance(experts, LoRAGroupedExperts),
        "factor_on_ep": (factor.device_mesh.mesh_dim_names[-1], factor.placements[-1].is_shard(0)),
        "factor_like_base": (factor.device_mesh, factor.placements) == (experts.gate_proj.device_mesh,
                                                                        experts.gate_proj.placements),
        "factor_local_rows": factor.to_local().shape[0],
        "ckpt": str(ckpt), "step2": snapshots.snapshots[2]["weights"], "reloaded_step": reloaded.trainer.global_step,
        "reloaded_rows": reloaded.model.moe_layers()[0].experts.lora_A["gate_proj"].to_local().shape[0],
        "reloaded": full_state_dict(reloaded.model, all_ranks=True), "export": str(root / "hf")})


def main() -> None:
    global OUT, RANK
    scenario, OUT = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    if scenario == "hang":
        RANK = int(os.environ["RANK"])
        hang()
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    RANK = dist.get_rank()
    if scenario == "four":
        four_ranks(str(OUT / "hf_in"))
        four_sequence()
        dist.destroy_process_group()
        return
    if scenario == "compile":
        compiled_runs()
        dist.destroy_process_group()
        return
    if scenario == "adapters":
        adapter_runs(str(OUT / "hf_in"))
        dist.barrier()
        dist.destroy_process_group()
        return
    if scenario == "init_from":  # one part alone, for debugging
        strategy_init_from(str(OUT / "hf_in"))
        return
    parity()
    parity_layout("parity_ep1", ep=1)
    parity_layout("parity_hsdp", ep=1, replicate=2)
    checkpointing("full")
    checkpointing("selective")
    mixed_precision()
    hf_load(str(OUT / "hf_in"))
    sequence_parity("sp_segmented", "union", ep=2)
    sequence_parity("sp_sdpa_dense", "union", ep=1, attn_backend="sdpa_dense")
    sequence_parity("sp_block", "block", ep=2)
    sequence_parity("sp_kv_replicated", "union", ep=1, num_key_value_heads=1)
    if scenario == "core":
        strategy_init_from(str(OUT / "hf_in"))
        save("resume", train_and_resume("ep_resume", ParallelConfig(ep=2), ParallelConfig(ep=1)))
        conditional_runs()
        sequence_runs()
    dist.barrier()
    dist.destroy_process_group()
    # Every result is saved and both ranks passed the barrier. The deliberately failing participation-check
    # run can leave a gloo worker thread behind that aborts interpreter teardown ("terminate called without
    # an active exception", seen once in ~20 runs under load), so leave without running it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
