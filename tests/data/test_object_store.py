"""Shards on an object store: a real S3-compatible server (moto in server mode, its own process on a loopback
port) holds `lumina-data world` shards. `lumina-train data=parquet data.sources.0.path=s3://...` trains from
it; the store going away mid-run fails the run within its retry budget with one line naming the URL, and the
same command after the store is back resumes with the losses of an uninterrupted run (from local disk). Bad shards on the store
(missing, truncated, written with other settings) each raise naming the URL. A manifest on the store whose
image-file and token-file parts are on the store builds the same shards as the same files on local disk; a
missing or unsafe token-file object is named by its URL; lumina-generate reads its input image from the store."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pixel_helpers import picture
from s3_server import S3Server
from sample_helpers import NEWLINE, Shell

from lumina.cli.data import main as data_main
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import save_assets
from lumina.data.storage import InMemorySampleDataset, ParquetSampleDataset
from lumina.files.fs import Retry, StoreError, read_lines, with_retries
from lumina.generation.assets import GenerationAssets
from lumina.generation.run import load_image
from lumina.ingest.build_shards import BuildError, build_shards
from lumina.ingest.encode import PixelEncoder
from lumina.tokenizers.pixels import to_signed
from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer, RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.text import WordTokenizer
from lumina.tokenizers.token_files import TokenFileError, read_token_file, token_file_dict

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


def upload_tree(server: S3Server, local_dir: Path, prefix: str) -> str:
    """Every file under local_dir -> s3://BUCKET/prefix/<relative path>; returns the prefix URL."""
    fs = server.filesystem()
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        fs.pipe(f"{BUCKET}/{prefix}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def media(store, tmp_path_factory):
    """A manifest with a PNG part and an official-style .pkl token-file part, relative to it, on local disk
    and the same files on the store; the tokenizer (C = 3, K = 16, 16 px, patch 4), the PNG's pixels and the
    token file's codes."""
    server, _ = store
    rng = np.random.default_rng(3)
    images = to_signed(np.stack([picture(rng, 16, 16) for _ in range(12)]))
    tokenizer = RVQVisualTokenizer(RVQImageTokenizer.fit(images, RVQSettings(4, 16, 3, 8, 0)), 16)
    local = tmp_path_factory.mktemp("media")
    (local / "img").mkdir()
    (local / "tok").mkdir()
    pixels = picture(rng, 16, 16)
    Image.fromarray(pixels).save(local / "img" / "a.png")
    codes = torch.randint(0, 16, (6, 3), generator=torch.Generator().manual_seed(0))
    torch.save(token_file_dict(codes, (2, 3), image_size=(8, 12)), local / "tok" / "b.pkl")
    rows = [{"id": "png", "turns": [{"role": "user", "parts": [{"kind": "text", "ids": [1, 2]}]},
                                    {"role": "assistant", "parts": [{"kind": "image", "file": "img/a.png"}]}]},
            {"id": "pkl", "turns": [{"role": "user", "parts": [{"kind": "image", "path": "tok/b.pkl"},
                                                               {"kind": "text", "ids": [3]}]},
                                    {"role": "assistant", "parts": [{"kind": "text", "ids": [4, 5]}]}]}]
    (local / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return server, local, upload_tree(server, local, "media"), tokenizer, pixels, codes


def build(manifest: str | Path, out: Path, tokenizer: RVQVisualTokenizer):
    tokens = SpecialTokens.official(newline=NEWLINE).replace(codebook_size=16, num_codebooks=3)
    return build_shards([manifest], out, tokens, pixels=PixelEncoder(tokenizer), assets=save_assets(out, None, tokenizer))


def test_a_manifest_on_the_store_builds_the_rows_of_its_local_copy(media, tmp_path):
    _, local, url, tokenizer, pixels, codes = media
    remote_lines = list(read_lines(f"{url}/m.jsonl", chunk_bytes=7))  # lines split across many ranged reads
    assert remote_lines == (local / "m.jsonl").read_bytes().splitlines()
    report = build(f"{url}/m.jsonl", tmp_path / "remote", tokenizer)
    assert (report.rows_written, report.rows_skipped) == (2, 0)
    build(local / "m.jsonl", tmp_path / "local", tokenizer)
    shards = sorted(p.name for p in (tmp_path / "local").glob("*.parquet"))
    assert shards == sorted(p.name for p in (tmp_path / "remote").glob("*.parquet")) and shards
    for name in shards:
        assert (tmp_path / "remote" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    ds = ParquetSampleDataset(tmp_path / "remote")
    image, tokens_part = ds[0].turns[1].parts[0], ds[1].turns[0].parts[0]
    assert torch.equal(image.codes, tokenizer.encode(to_signed(pixels[None]))[0][0]) and image.grid == (4, 4)
    assert torch.equal(tokens_part.codes, codes) and tokens_part.grid == (2, 3)


def test_a_missing_or_unsafe_token_file_on_the_store_is_named_by_its_url(media, tmp_path):
    server, local, url, tokenizer, _, _ = media
    row = {"id": "gone", "turns": [{"role": "user", "parts": [{"kind": "image", "path": "tok/absent.pkl"}]},
                                   {"role": "assistant", "parts": [{"kind": "text", "ids": [4]}]}]}
    server.filesystem().pipe(f"{BUCKET}/media/gone.jsonl", (json.dumps(row) + "\n").encode())
    with pytest.raises(BuildError, match=f"^{url}/gone.jsonl:1: token file {url}/tok/absent.pkl does not exist"):
        build(f"{url}/gone.jsonl", tmp_path / "out", tokenizer)
    with pytest.raises(FileNotFoundError, match=f"manifest {url}/nothing.jsonl does not exist"):
        build(f"{url}/nothing.jsonl", tmp_path / "out2", tokenizer)

    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pkl"
    torch.save({"indices": Shell(f"touch {marker}"), "coords": [[0, 0, 0, 0, 0]]}, evil)
    server.filesystem().pipe(f"{BUCKET}/media/tok/evil.pkl", evil.read_bytes())
    with pytest.raises(TokenFileError, match=rf"token file {url}/tok/evil.pkl cannot be read safely.*system"):
        read_token_file(f"{url}/tok/evil.pkl", "image", num_codebooks=3, codebook_size=16)
    assert not marker.exists()


def test_generation_reads_its_input_image_from_the_store(media):
    _, local, url, tokenizer, _, _ = media
    tokens = SpecialTokens.official(newline=NEWLINE).replace(codebook_size=16, num_codebooks=3)
    assets = GenerationAssets(WordTokenizer(["a"]), tokens, tokenizer, "own")
    for name in ("tok/b.pkl", "img/a.png"):
        remote, here = load_image(f"{url}/{name}", assets), load_image(str(local / name), assets)
        assert torch.equal(remote.codes, here.codes) and remote.grid == here.grid
    with pytest.raises(FileNotFoundError, match=f"image '{url}/img/absent.png' does not exist"):
        load_image(f"{url}/img/absent.png", assets)
