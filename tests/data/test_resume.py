"""Exact resume of LuminaDataModule under a real Lightning Trainer: one process, and two gloo ranks launched
as fresh processes (save after k steps, restart, identical batches on every rank; re-deal 2 -> 1, 1 -> 2).

Two-rank runs start as fresh processes from a fork server that has only imported torch / lightning / lumina
(no test state), so every launch is a clean restart without paying the imports again.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import socket
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from synthetic_source import SyntheticSource

from lumina.data.datamodule import DataConfig, LuminaDataModule

BASE = [5, 9, 3, 7, 12, 4, 6, 8, 2, 10, 11, 3, 5, 7, 9, 1, 6, 8, 14, 2, 3, 4, 13, 5, 6, 7, 2, 9]
SEQ_LEN = 16


def make_source() -> SyntheticSource:
    return SyntheticSource(BASE, num_codebooks=2, drop_prob=0.5, drop=3)


def digest(batch) -> str:
    h = hashlib.sha1()
    for name in ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
                 "token_valid", "noise_t", "answer_mask", "cu_seqlens"):
        h.update(getattr(batch, name).contiguous().numpy().tobytes())
    return h.hexdigest()


class Recorder(L.LightningModule):
    """Records, per training step: (epoch, sample indices of the pack's segments, digest of the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list] = []

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        ids, bounds = batch.input_ids[0], batch.seg_bounds
        starts = [b for b in bounds[:-1] if batch.token_valid[0, b]]  # an all-padding pack has none
        samples = [int(ids[b, 0]) for b in starts]
        epochs = {int(ids[b, 1]) for b in starts}
        assert epochs <= {self.current_epoch}, (epochs, self.current_epoch)
        self.seen.append([self.current_epoch, samples, digest(batch)])
        return (self.w * batch.token_valid.float().mean()).sum()

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val_tokens", batch.token_valid.float().sum(), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def run_phase(world: int, out: Path, name: str, max_epochs: int, max_steps: int = -1, every: int | None = None,
              every_epoch: bool = False, resume: str | None = None, workers: int = 0,
              val_every: int | None = None) -> dict:
    """One `Trainer.fit`; returns {"batches": this rank's records, "state": datamodule state at the end}.
    val_every: validate every that many steps (on a held-out source); checkpoints then save at validation end."""
    val_source = SyntheticSource(BASE[:6], num_codebooks=2) if val_every else None
    dm = LuminaDataModule(DataConfig(seq_len=SEQ_LEN, num_workers=workers, num_codebooks=2), make_source(),
                          val_source)
    model = Recorder()
    callbacks = []
    if every or every_epoch:
        callbacks.append(ModelCheckpoint(dirpath=out / name, every_n_train_steps=every,
                                         every_n_epochs=1 if every_epoch else None, save_top_k=-1,
                                         filename="{epoch}-{step}"))
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", num_nodes=1,
                        max_epochs=max_epochs, max_steps=max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False, callbacks=callbacks,
                        enable_checkpointing=bool(callbacks), num_sanity_val_steps=0,
                        val_check_interval=val_every, check_val_every_n_epoch=None if val_every else 1)
    trainer.fit(model, datamodule=dm, ckpt_path=resume)
    return {"batches": model.seen, "state": dm.state_dict()["schedule"], "rank": trainer.global_rank}


def _worker(rank: int, world: int, out: str, phases: list[dict], port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    for phase in phases:
        result = run_phase(world, Path(out), **phase)
        (Path(out) / f"{phase['name']}_rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, out: Path, phases: list[dict]) -> None:
    """Run the phases in `world` fresh processes (one gloo rank each)."""
    multiprocessing.set_forkserver_preload(["torch", "lightning", "lumina.data.datamodule"])
    torch.multiprocessing.start_processes(_worker, args=(world, str(out), phases, _free_port()), nprocs=world,
                                          start_method="forkserver")


def run_here(out: Path, phases: list[dict]) -> None:
    """Run the phases as one rank in this process."""
    for phase in phases:
        result = run_phase(1, out, **phase)
        (out / f"{phase['name']}_rank0.json").write_text(json.dumps(result))


def load(out: Path, name: str, world: int) -> list[dict]:
    return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(world)]


def only_ckpt(out: Path, name: str) -> str:
    found = sorted((out / name).glob("*.ckpt"))
    assert len(found) == 1, found
    return str(found[0])


def samples_of(records: list[dict], epoch: int, first: int | None = None) -> list[int]:
    """All sample indices trained in `epoch` by the given ranks (each rank's first `first` steps)."""
    return [i for rec in records for e, samples, _ in rec["batches"][:first] if e == epoch for i in samples]


# ---------------------------------------------------------------- one process


@pytest.mark.parametrize(("every", "every_epoch", "max_steps", "workers", "val_every"),
                         [(4, False, 6, 0, None), (None, True, 13, 2, None), (None, True, 6, 0, 4)])
def test_resume_single_process(tmp_path: Path, every: int | None, every_epoch: bool, max_steps: int,
                               workers: int, val_every: int | None) -> None:
    """Checkpoints at a step end (the loop and workers prefetch ahead), at an epoch end and at a mid-epoch
    validation end all resume to exactly the batches of the uninterrupted run."""
    full = run_phase(1, tmp_path, "full", max_epochs=3, val_every=val_every)["batches"]
    run_phase(1, tmp_path, "part", max_epochs=3, max_steps=max_steps, every=every, every_epoch=every_epoch,
              workers=workers, val_every=val_every)
    ckpt = sorted((tmp_path / "part").glob("*.ckpt"))[0]
    k = torch.load(ckpt, weights_only=False)["global_step"]
    rest = run_phase(1, tmp_path, "rest", max_epochs=3, resume=str(ckpt), workers=workers,
                     val_every=val_every)["batches"]
    assert 0 < k < len(full)
    assert rest == full[k:]
    for epoch in range(3):  # every sample exactly once per epoch
        assert sorted(samples_of([{"batches": full}], epoch)) == list(range(len(BASE)))


# ---------------------------------------------------------------- two gloo ranks

K2, K1 = 3, 5  # steps before the checkpoint: 2-rank run, 1-rank run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume")
    launch(2, out, [dict(name="full2", max_epochs=2),
                    dict(name="part2", max_epochs=2, max_steps=K2 + 2, every=K2, workers=2)])
    run_here(out, [dict(name="r21", max_epochs=2, resume=only_ckpt(out, "part2")),
                    dict(name="part1", max_epochs=2, max_steps=K1 + 1, every=K1)])
    launch(2, out, [dict(name="r22", max_epochs=2, resume=only_ckpt(out, "part2")),
                    dict(name="r12", max_epochs=2, resume=only_ckpt(out, "part1"))])
    return out


def test_two_ranks_resume_identical(runs: Path) -> None:
    full, resumed = load(runs, "full2", 2), load(runs, "r22", 2)
    assert [r["rank"] for r in full] == [0, 1]
    assert full[0]["batches"] != full[1]["batches"]  # ranks train different packs
    assert len(full[0]["batches"]) == len(full[1]["batches"])
    for r in range(2):
        assert resumed[r]["batches"] == full[r]["batches"][K2:]
    assert full[0]["state"] == resumed[0]["state"]
    for epoch in range(2):
        assert sorted(samples_of(full, epoch)) == list(range(len(BASE)))
    # an epoch that plans an odd number of packs ends with one all-padding pack on one rank
    padding = [[e for e, samples, _ in rec["batches"] if not samples] for rec in full]
    planned = [sum(1 for rec in full for e, samples, _ in rec["batches"] if e == epoch and samples)
               for epoch in range(2)]
    assert sorted(padding[0] + padding[1]) == [epoch for epoch in range(2) if planned[epoch] % 2]
    assert padding[0] + padding[1]  # this data exercises the all-padding path


def test_two_to_one_redeals_remaining(runs: Path) -> None:
    before = samples_of(load(runs, "full2", 2), 0, first=K2)  # what the 2-rank run trained before saving
    (after,) = load(runs, "r21", 1)
    assert sorted(before + samples_of([after], 0)) == list(range(len(BASE)))
    assert sorted(samples_of([after], 1)) == list(range(len(BASE)))


def test_one_to_two_redeals_remaining(runs: Path) -> None:
    (part,) = load(runs, "part1", 1)
    before = samples_of([part], 0, first=K1)
    after = load(runs, "r12", 2)
    assert len(after[0]["batches"]) == len(after[1]["batches"])
    assert sorted(before + samples_of(after, 0)) == list(range(len(BASE)))
    assert sorted(samples_of(after, 1)) == list(range(len(BASE)))

