"""`build_datamodule` from a training data config: several sources form a weighted mixture whose realised
proportions are logged every epoch and match what the packs actually hold."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from lumina.contract.schema import Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.sources import MixtureSource
from lumina.data.storage import write_samples
from lumina.model.config import LuminaConfig
from lumina.training.data_factory import build_datamodule
from lumina.training.errors import ConfigError

TOKENS = SpecialTokens(text_vocab_size=512, pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7,
                       bo3d=8, eo3d=9, system_open=10, system_close=11, user_open=12, user_close=13,
                       uncondition=14, codebook_size=64, num_codebooks=4)
MARK = {"a": 20, "b": 21}  # the user text of every sample of a source: row 1 of its laid-out sequence


def write_source(root, name: str, n: int, split: str = "train") -> str:
    samples = [Sample(f"{name}-{split}-{i}", [Turn("user", [Text([MARK[name]])]),
                                              Turn("assistant", [Text([30 + i % 50, 31])])])
               for i in range(n)]
    out = root / f"{name}-{split}"
    write_samples(samples, out, TOKENS)
    return str(out)


def data_config(tmp_path, **extra) -> dict:
    sources = [{"name": name, "weight": weight, "path": write_source(tmp_path, name, size),
                "options": {"val_path": write_source(tmp_path, name, val, "val")}}
               for name, weight, size, val in (("a", 1.0, 30, 3), ("b", 3.0, 7, 2))]
    return {"seq_len": 64, "seed": 5, "pad_id": 0, "num_codebooks": 4, "sources": sources,
            "samples_per_epoch": 1000, **extra}


def test_two_sources_form_a_weighted_mixture(tmp_path, caplog):
    dm = build_datamodule(data_config(tmp_path), LuminaConfig.tiny())
    assert isinstance(dm.train_source, MixtureSource) and len(dm.train_source) == 1000
    with caplog.at_level(logging.INFO, logger="lumina.data.sources"):
        batches = list(dm.train_dataloader())
    mix = dm.train_source.mix(0)
    assert "epoch 0 mixture of 1000 samples, realised proportions: a " in caplog.text
    # the packs hold exactly the drawn mix: count segments by their user-text mark
    found = {"a": 0, "b": 0}
    for b in batches:
        for start in b.seg_bounds[:-1]:
            mark = int(b.input_ids[0, start + 1, 0])
            found[{20: "a", 21: "b"}[mark]] += 1
    assert found == mix.counts and sum(found.values()) == 1000
    # weights 1:3 -> shares 0.25 / 0.75; sd of a share over 1000 draws = sqrt(0.1875 / 1000) = 0.0137
    assert abs(mix.proportions["b"] - 0.75) < 4 * 0.0137
    assert mix.proportions == {k: v / 1000 for k, v in found.items()}
    # validation: both held-out sets, concatenated (3 + 2 samples)
    assert len(dm.val_source) == 5


class MetricsLogger(Logger):
    """Keeps every logged metrics dict (a real Lightning logger that writes to memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict] = []

    name, version = "memory", 0

    @property
    def experiment(self) -> None:
        return None

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.logged.append(dict(metrics))


class Touch(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch.token_valid.float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_logs_realised_proportions_each_epoch(tmp_path):
    dm = build_datamodule(data_config(tmp_path, samples_per_epoch=40), LuminaConfig.tiny())
    logger = MetricsLogger()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=logger, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, use_distributed_sampler=False,
                        limit_val_batches=0, log_every_n_steps=1000)
    trainer.fit(Touch(), datamodule=dm)
    mixes = [m for m in logger.logged if "data/mix/a" in m]
    assert mixes == [{"data/mix/a": dm.train_source.mixture.epoch(e).proportions["a"],
                      "data/mix/b": dm.train_source.mixture.epoch(e).proportions["b"]} for e in (0, 1)]
    assert all(abs(m["data/mix/a"] + m["data/mix/b"] - 1.0) < 1e-9 for m in mixes)


def test_one_source_is_not_a_mixture(tmp_path):
    cfg = data_config(tmp_path)
    cfg["sources"] = cfg["sources"][:1]
    dm = build_datamodule(cfg, LuminaConfig.tiny())
    assert not isinstance(dm.train_source, MixtureSource) and len(dm.train_source) == 30


@pytest.mark.parametrize(("change", "pattern"), [
    (lambda c: c["sources"][1].update(name="a"), r"data.sources names \['a', 'a'\]: must be unique"),
    (lambda c: c.update(sources=[]), "data.sources is empty"),
    (lambda c: c["sources"][1].update(path="/nonexistent"), r"data.sources\[1\].path='/nonexistent'"),
    (lambda c: c["sources"][0]["options"].update(cache=3),
     r"data.sources\[0\].options.cache: unknown option .*'cache_row_groups', 'read_attempts'"),
    (lambda c: c["sources"][0]["options"].update(read_attempts=0),
     r"data.sources\[0\].options.cache_row_groups / read_attempts: retry attempts=0: must be >= 1"),
])
def test_bad_source_lists_raise(tmp_path, change, pattern):
    cfg = data_config(tmp_path)
    change(cfg)
    with pytest.raises(ConfigError, match=pattern):
        build_datamodule(cfg, LuminaConfig.tiny())


def test_samples_per_epoch_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="DataConfig.samples_per_epoch=0"):
        build_datamodule(data_config(tmp_path, samples_per_epoch=0), LuminaConfig.tiny())


def test_parquet_reading_options_reach_the_dataset(tmp_path):
    cfg = data_config(tmp_path)
    cfg["sources"] = cfg["sources"][:1]
    cfg["sources"][0]["options"].update(cache_row_groups=2, read_attempts=7)
    dataset = build_datamodule(cfg, LuminaConfig.tiny()).train_source.dataset
    assert dataset._cache_size == 2 and dataset.retry.attempts == 7
