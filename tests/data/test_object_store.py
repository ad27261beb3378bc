"""Shards on an object store: a real S3-compatible server (moto in server mode, its own process on a loopback
port) holds `lumina-data world` shards. `lumina-train data=parquet data.sources.0.path=s3://...` trains from
it; the store going away mid-run fails the run within its retry budget with one line naming the URL, and the
same command after the store is back resumes with the losses of an uninterrupted run (from local disk). Bad shards on the store
(missing, truncated, written with other settings) each raise naming the URL."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from s3_server import S3Server

from lumina.cli.data import main as data_main
from lumina.data.fs import Retry, StoreError, with_retries
from lumina.data.storage import InMemorySampleDataset, ParquetSampleDataset

BUCKET, PREFIX = "lumina", "world/train"
URL = f"s3://{BUCKET}/{PREFIX}"
# a small store-backed run: one row group per 8-sample shard and a one-group cache, so packs keep reading
TRAIN = ["experiment=debug", "data=parquet", "data.sources.0.options.cache_row_groups=1",
         "data.sources.0.options.read_attempts=2", "trainer.max_steps=8", "trainer.limit_val_batches=0",
         "callbacks.checkpoint.every_n_train_steps=2", "callbacks.progress_bar=null", "callbacks.expert_usage=null",
         "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=csv"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    assert data_main(["world", "--out", str(root / "world"), "--num-samples", "40", "--rows-per-shard", "8",
                      "--cache-dir", str(root / "cache")]) == 0
    server = S3Server()
    server.start()
    saved = {k: os.environ.get(k) for k in server.env}
    server.upload(root / "world", BUCKET, PREFIX)
    yield server, root
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def train(server: S3Server, run_dir: Path, path: str = URL) -> subprocess.Popen:
    env = {**os.environ, **server.env}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "lumina.train", *TRAIN, f"data.sources.0.path={path}",
                             f"hydra.run.dir={run_dir}"], cwd=run_dir.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def losses(run_dir: Path, version: int) -> dict[int, float]:
    rows = csv.DictReader((run_dir / "csv" / f"version_{version}" / "metrics.csv").open())
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def test_training_from_the_store_survives_an_outage(store, tmp_path):
    server, root = store
    straight = train(server, tmp_path / "straight", str(root / "world"))  # uninterrupted, from local disk
    run_dir = tmp_path / "outage"
    job = train(server, run_dir)
    deadline = time.monotonic() + 600
    while not list((run_dir / "checkpoints").glob("step*.ckpt")) and job.poll() is None:  # the step-2 checkpoint
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.stop()
    try:
        _, err = job.communicate(timeout=300)  # no hang: the retry budget ends it
    finally:
        server.start()
        server.upload(root / "world", BUCKET, PREFIX)
    _, straight_err = straight.communicate(timeout=600)
    assert straight.returncode == 0, straight_err[-3000:]
    want = losses(tmp_path / "straight", 0)
    assert sorted(want) == list(range(8)) and len({round(v, 6) for v in want.values()}) == 8
    assert job.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("lumina-train: error:")]
    assert len(errors) == 1, err[-3000:]
    assert f"{URL}/world-train-" in errors[0] and ".parquet: reading row group 0 failed 2 times" in errors[0]
    saved_steps = sorted(int(p.stem.removeprefix("step")) for p in (run_dir / "checkpoints").glob("step*.ckpt"))
    assert saved_steps and saved_steps[-1] < 8  # it failed mid-run, after a checkpoint

    again = train(server, run_dir)  # the same command, the store back
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    resumed = losses(run_dir, 1)
    assert min(resumed) == saved_steps[-1] and max(resumed) == 7  # resumed at the last checkpoint
    for step, loss in resumed.items():
        assert loss == want[step], f"step {step}"


def test_bad_shards_on_the_store_name_the_url(store):
    server, root = store
    fs = server.filesystem()
    local = sorted((root / "world").glob("*.parquet"))
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/absent: no such shard"):
        ParquetSampleDataset(f"s3://{BUCKET}/absent")
    missing = f"s3://{BUCKET}/{PREFIX}/world-train-00099.parquet"
    with pytest.raises(FileNotFoundError, match=missing):
        ParquetSampleDataset([f"{URL}/{local[0].name}", missing])

    data = local[0].read_bytes()
    fs.pipe(f"{BUCKET}/truncated/a.parquet", data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"s3://{BUCKET}/truncated/a.parquet: not a readable Parquet shard"):
        ParquetSampleDataset(f"s3://{BUCKET}/truncated")

    good = ParquetSampleDataset(local[0])
    other = dataclasses.replace(good.tokens, text_vocab_size=good.tokens.text_vocab_size + 7)
    foreign = InMemorySampleDataset([good[i] for i in range(len(good))], other).save(root / "foreign", prefix="zz")
    fs.pipe(f"{BUCKET}/mixed/aa.parquet", data)
    fs.pipe(f"{BUCKET}/mixed/zz.parquet", foreign[0].read_bytes())
    with pytest.raises(ValueError, match=f"s3://{BUCKET}/mixed/zz.parquet: special-token/codebook settings differ "
                                         r"from shard s3://lumina/mixed/aa.parquet: text_vocab_size"):
        ParquetSampleDataset(f"s3://{BUCKET}/mixed")

    remote = ParquetSampleDataset(URL)  # the store's shards read as the local ones
    assert len(remote) == 40 and remote.sample_ids()[:8] == good.sample_ids()
    assert remote[3].id == good[3].id and remote.laid_out_lengths()[:8].tolist() == good.laid_out_lengths().tolist()


def test_retry_budget_is_bounded_and_not_spent_on_bad_data():
    calls = []

    def refused():
        calls.append(time.monotonic())
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(StoreError, match=r"s3://b/k: reading failed 3 times in [\d.]+ s; last error: "
                                         "ConnectionRefusedError"):
        with_retries("s3://b/k", "reading", refused, Retry(attempts=3, backoff_s=0.01))
    assert len(calls) == 3
    calls.clear()

    def corrupt():
        calls.append(0)
        raise ValueError("bad footer")

    with pytest.raises(ValueError, match="bad footer"):
        with_retries("s3://b/k", "reading", corrupt, Retry(attempts=3, backoff_s=0.01))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="attempts=0"):
        Retry(attempts=0)
