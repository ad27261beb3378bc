"""The data path at scale: epoch start (CFG dropout + plan) beside the packer lumina had before, fill ratio,
and the packed loader's throughput from local disk and from a loopback S3 store next to what a training step
consumes.

    python experiments/bench/data.py [--sizes 1e6 1e7 1e8] [--before-max 1e6] [--seq-len 16384]
        [--mixture-samples 1e6] [--world-samples 4000] [--packs 40] [--repeats 3]
        [--sections start mixture fill loader train]

Epoch start: synthetic, seeded log-normal laid-out lengths (median 512, sigma 1, clipped to 16-8,192) with four
CFG variants per sample, at seq_len 16,384. "now": `noise.dropout_lengths` (counter-based coins over the id
hashes) + `plan.plan_epoch` (the compiled best fit, flat arrays) + the fingerprint, over what a dataset holds
(lengths [N, 4] uint16, id hashes [N] uint64). "before": what lumina ran until this change, in the same run:
one `torch.Generator` per sample id for the coins (`cfg_dropout` then), the pure-Python best fit
(`tests/data/reference_packing.py`, the readable reference the tests compare against) and the plan as tuples,
over what the datasets held then (lengths [N, 4] int64, ids as Python strings). Each size runs in a fresh
process; peak RSS is that process's (inputs included; "inputs" is the RSS before the epoch start). At the
sizes both run, the compiled packer is also run on the "before" lengths and must give identical packs.

Loader: `LuminaDataModule` over `lumina-data world` shards (rows_per_shard 256, `cache_row_groups` 4) read
from a local directory and from a moto S3 server on 127.0.0.1 (`tests/data/s3_server.py`), 0 / 2 / 4 workers:
packs/s and tokens/s (median over `repeats` passes of `packs` packs, the first pack not timed). Training step:
a few optimizer steps of `lumina-train` at the default config and at `experiment=learns_cpu` (median step time
after the first) -> the packs/s and tokens/s the step consumes.

Measured 2026-12-02 on the shared 2-core CPU (load average 9-14 from other jobs), defaults. Epoch start:

| samples | path | dropout s | plan s | fingerprint s | total s | us/sample | peak RSS MiB | packs | fill |
|---|---|---|---|---|---|---|---|---|---|
| 1M | before | 16.74 | 6.25 | 0.15 | 23.14 | 23.1 | 529 | 48,308 | 0.9996 |
| 1M | now | 0.02 | 0.16 | 0.01 | **0.19** | 0.19 | 442 | 48,306 | 0.9996 |
| 10M | before (extrapolated) | | | | 231 | | | | |
| 10M | now | 0.07 | 1.79 | 0.06 | **1.92** | 0.19 | 686 | 482,104 | 0.9996 |
| 100M | before (extrapolated) | | | | 2314 | | | | |
| 100M | now | 1.33 | 22.22 | 0.58 | **24.13** | 0.24 | 3549 | 4,825,388 | 0.9996 |

The compiled packer gave the old packer's packs on the same 1M lengths (same packs: yes; the pack counts of
the two paths differ because their CFG coins differ). Peak RSS includes the inputs and the interpreter with
torch (442 MiB at 1M); the 100M inputs are 2,596 MiB, so the epoch start itself adds ~1 GiB. An earlier run
at load average 14-15 gave 34.9 s at 100M; the Fenwick-tree kernel before the bitset, 94.9 s. Id hashes cost
29-72 ns per id once at dataset load. At 1B samples (extrapolated, linear): now ~4 min and ~31 GiB per rank
(16 bytes per sample of inputs: the uint16 length table and the id hash); before ~6.4 h (at 23 us/sample)
and ~100 GiB (~100 bytes per sample of Python objects).

Mixture epoch start (`--sections mixture`): N slots drawn over 3 sources of 0.4 N, 0.3 N and 0.05 N samples
(weights 0.5 / 0.3 / 0.2, so the small source is cycled 4x), then dropout + plan + fingerprint, seq_len 16,384.
"before": the draw as (source, index) Python tuples per slot and the lengths / hashes gathered item by item,
as lumina did until this change; "now": `MixturePlan.epoch` in arrays (uint8 source, int64 index) and the
compiled per-source row gather. Same draws, so the same plan (fingerprints equal). Medians of 3 runs at 1M
(one run at 10M), load average 7-11:

| slots | path | draw + gather s | dropout s | plan s | total s | inputs MiB | peak MiB | packs |
|---|---|---|---|---|---|---|---|---|
| 1M | before | 2.12 | 0.01 | 0.13 | 2.29 | 390 | 832 | 48,173 |
| 1M | now | **0.14** | 0.01 | 0.14 | **0.29** | 390 | 438 | 48,173 |
| 10M | before | 18.40 | 0.04 | 1.54 | 20.04 | 520 | 4,872 | 482,533 |
| 10M | now | **2.68** | 0.06 | 1.97 | **4.77** | 520 | 930 | 482,533 |

The draw itself keeps torch's multinomial and per-source randperm (they define which samples an epoch gets,
and so checkpoints); the Python tuples, ints and lists it no longer builds cost ~410 bytes of peak memory per
slot (394 MiB at 1M, 3.9 GiB at 10M; at 100M slots ~39 GiB per rank before, ~1 GiB now: 9 bytes per slot
plus the lengths and hashes gathered).

Fill (sample tokens / pack tokens; shuffled best fit is the default):

| lengths | seq_len | samples | mean len | packs | BFD | shuffled best fit | next-fit | naive pad |
|---|---|---|---|---|---|---|---|---|
| built-in world | 4096 | 4,000 | 95 | 93 | 0.9956 | **0.9956** | 0.9850 | 0.0231 |
| built-in world | 16384 | 4,000 | 95 | 24 | 0.9645 | **0.9645** | 0.9645 | 0.0058 |
| log-normal synthetic | 4096 | 200,000 | 835 | 35,539 | 0.9999 | **0.9966** | 0.8352 | 0.1805 |
| log-normal synthetic | 16384 | 200,000 | 835 | 10,197 | 1.0000 | **0.9994** | 0.9376 | 0.0510 |

(4,000 world samples fill 23.2 packs of 16,384: the last pack is the shortfall.) Loader, 4,000 world samples
in 16 shards, beside the training step's consumption:

| store | seq_len | workers | packs/s | tokens/s |
|---|---|---|---|---|
| local | 256 | 0 / 2 / 4 | 107.9 / 70.3 / 72.5 | 24,311 / 15,845 / 16,340 |
| loopback S3 | 256 | 0 / 2 / 4 | 21.6 / 31.4 / 37.9 | 4,869 / 7,068 / 8,544 |
| local | 2048 | 0 / 2 / 4 | 8.5 / 13.0 / 18.1 | 17,377 / 26,622 / 37,003 |
| loopback S3 | 2048 | 0 / 2 / 4 | 4.4 / 4.2 / 4.3 | 8,886 / 8,575 / 8,741 |
| training step, default (tiny, seq_len 256) | 256 | | 5.71 (0.175 s/step) | 1,415 |
| training step, learns_cpu | 2048 | | 1.11 (0.903 s/step) | 2,263 |

Every loader configuration outruns the CPU step it feeds (by at least 3.8x: S3 at 2048 with 2 workers). From the store,
each cache miss fetches a 256-row group in one coalesced range request (the footer and size come from the
index read; before that change, 5.9 packs/s at 256 with 0 workers); at 2048 more workers do not help because
the one-process moto server is the bottleneck on these 2 cores. Locally at 256 a pack is cheap to build, so
worker processes cost more than they save on this oversubscribed machine; at 2048 they pay (2.1x with 4).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "data"))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_variants(n: int, seed: int = 0, dtype=np.uint16) -> np.ndarray:  # noqa: ANN001
    """[n, 4] laid-out lengths (keep, drop_text, drop_image, drop_both), log-normal keep lengths in 16-8192."""
    rng = np.random.default_rng(seed)
    keep = np.clip(rng.lognormal(np.log(512), 1.0, n), 16, 8192).astype(np.int32)
    out = np.empty((n, 4), dtype)
    out[:, 0] = keep
    out[:, 1] = np.maximum(keep - 24, 16)
    out[:, 2] = np.maximum(keep // 2, 16)
    out[:, 3] = np.maximum(keep // 2 - 24, 16)
    return out


def start_now(n: int, seq_len: int) -> dict:
    from lumina.data.epoch_plan import plan_epoch
    from lumina.data.noise import NoiseConfig, dropout_lengths

    stored = synthetic_variants(n)
    hashes = np.random.default_rng(1).integers(0, 2**63, n).astype(np.uint64)  # what id_hashes gave at load
    plan_epoch(stored[:1000, 0], seq_len, 0, 0)  # numba: load the cached kernels outside the timing
    inputs = rss_mib()
    t0 = time.perf_counter()
    lengths = dropout_lengths(stored, hashes, NoiseConfig(), 0, 0)
    t1 = time.perf_counter()
    plan = plan_epoch(lengths, seq_len, 0, 0)
    t2 = time.perf_counter()
    plan.fingerprint()
    t3 = time.perf_counter()
    return {"dropout_s": t1 - t0, "plan_s": t2 - t1, "fingerprint_s": t3 - t2, "total_s": t3 - t0,
            "inputs_mib": inputs, "peak_mib": rss_mib(), "packs": plan.num_packs, "fill": plan.packing.fill_ratio}


def start_before(n: int, seq_len: int) -> dict:
    import hashlib

    import torch
    from reference_packing import reference_best_fit

    from lumina.data.noise import NoiseConfig, stable_seed
    from lumina.data.packing import best_fit

    cfg = NoiseConfig()
    stored = synthetic_variants(n, dtype=np.int64)
    ids = [f"s{i}" for i in range(n)]
    inputs = rss_mib()
    t0 = time.perf_counter()
    column = []
    for sid in ids:  # cfg_dropout as it was: one generator per sample
        gen = torch.Generator()
        gen.manual_seed(stable_seed(0, 0, sid, "cfg"))
        u = torch.rand(2, generator=gen, dtype=torch.float64)
        column.append(int(u[0] < cfg.uncond_text_prob) + 2 * int(u[1] < cfg.uncond_image_prob))
    lengths = stored[np.arange(n), column].tolist()
    t1 = time.perf_counter()
    packs, tokens, _ = reference_best_fit(lengths, seq_len, np.random.default_rng([0, 0, 0]), "shuffled")
    packs = tuple(tuple(p) for p in packs)
    order = tuple(np.random.default_rng([0, 0, 1]).permutation(len(packs)).tolist())
    lengths_t = tuple(int(x) for x in lengths)
    t2 = time.perf_counter()
    h = hashlib.blake2b(digest_size=8)
    for p in order:
        h.update(np.asarray(packs[p], dtype=np.int64).tobytes())
        h.update(b"|")
    h.hexdigest()
    t3 = time.perf_counter()
    peak = rss_mib()
    now = best_fit(np.asarray(lengths_t), seq_len, np.random.default_rng([0, 0, 0]), "shuffled")
    same = now.num_packs == len(packs) and all(now.pack(k) == packs[k] for k in range(len(packs)))
    return {"dropout_s": t1 - t0, "plan_s": t2 - t1, "fingerprint_s": t3 - t2, "total_s": t3 - t0,
            "inputs_mib": inputs, "peak_mib": peak, "packs": len(packs), "fill": sum(tokens) / (len(packs) * seq_len),
            "identical_packs": same}


def id_hash_note(n: int = 10**6) -> None:
    """What a dataset pays once at load: id hashes of n Arrow string ids."""
    import pyarrow as pa

    from lumina.data.noise import id_hashes

    ids = pa.array([f"sample-{i:09d}" for i in range(n)], pa.string())
    id_hashes(ids[:10])
    t = time.perf_counter()
    id_hashes(ids)
    dt = time.perf_counter() - t
    print(f"\nid hashes at dataset load: {n:,} Arrow ids of 16 bytes in {dt:.3f} s ({dt / n * 1e9:.0f} ns per id)")


def epoch_start_section(sizes: list[int], before_max: int, seq_len: int) -> None:
    id_hash_note()
    print(f"\nEpoch start at seq_len {seq_len} (dropout + plan + fingerprint; peak RSS of a fresh process)\n")
    print("| samples | path | dropout s | plan s | fingerprint s | total s | us/sample | inputs MiB | peak MiB | "
          "packs | fill | same packs |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    before_rate = None
    for n in sizes:
        for path in ("before", "now"):
            if path == "before" and n > before_max:
                if before_rate is not None:
                    print(f"| {n:,} | before (extrapolated) | | | | {before_rate * n:.0f} | {before_rate * 1e6:.1f} "
                          "| | | | | |")
                continue
            out = subprocess.run([sys.executable, __file__, "--child", path, str(n), str(seq_len)],
                                 capture_output=True, text=True, timeout=7200, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if out.returncode:
                print(out.stderr[-2000:])
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if path == "before":
                before_rate = r["total_s"] / n
            same = {True: "yes", False: "NO"}.get(r.get("identical_packs"), "")
            print(f"| {n:,} | {path} | {r['dropout_s']:.2f} | {r['plan_s']:.2f} | {r['fingerprint_s']:.2f} | "
                  f"{r['total_s']:.2f} | {r['total_s'] / n * 1e6:.2f} | {r['inputs_mib']:.0f} | {r['peak_mib']:.0f} | "
                  f"{r['packs']:,} | {r['fill']:.4f} | {same} |", flush=True)


# ---- mixture epoch start ----
MIX_SIZES = {"web": 0.4, "sft": 0.3, "small": 0.05}  # source sizes as fractions of the epoch's samples
MIX_WEIGHTS = {"web": 0.5, "sft": 0.3, "small": 0.2}


class ArraySource:
    """A source as the mixture sees one: stored lengths [n, 4] uint16 and id hashes, no payloads."""

    def __init__(self, n: int, seed: int) -> None:
        from lumina.contract.special_tokens import SpecialTokens

        self.tokens = SpecialTokens.official()
        self._lengths = synthetic_variants(n, seed)
        self._hashes = np.random.default_rng(seed + 100).integers(0, 2**63, n).astype(np.uint64)

    def __len__(self) -> int:
        return len(self._hashes)

    def laid_out_lengths(self) -> np.ndarray:
        return self._lengths

    def id_hashes(self) -> np.ndarray:
        return self._hashes


def mixture_draw_before(mixture, epoch: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """MixturePlan.epoch + MixtureSource's lookups as they were: (source, index) Python tuples per slot, then
    the stored lengths and id hashes gathered item by item -> (lengths [n, 4] int64, hashes [n])."""
    import math

    import torch

    from lumina.data.mixture import _seed

    gen = torch.Generator().manual_seed(_seed("mixture", mixture.seed, epoch))
    probs = torch.tensor([mixture.weights[n] for n in mixture.names], dtype=torch.float64)
    choice = torch.multinomial(probs, mixture.samples_per_epoch, replacement=True, generator=gen)
    counts = torch.bincount(choice, minlength=len(mixture.names)).tolist()
    picks = []
    for name, count in zip(mixture.names, counts, strict=True):
        size = len(mixture.sources[name])
        source_gen = torch.Generator().manual_seed(_seed("mixture-index", mixture.seed, epoch, name))
        rounds = [torch.randperm(size, generator=source_gen) for _ in range(math.ceil(count / size))] if count else []
        picks.append(torch.cat(rounds)[:count].tolist() if rounds else [])
    cursor = [0] * len(mixture.names)
    items = []
    for k in choice.tolist():
        items.append((mixture.names[k], picks[k][cursor[k]]))
        cursor[k] += 1
    table = {name: mixture.sources[name].laid_out_lengths() for name in mixture.names}
    hashes = {name: mixture.sources[name].id_hashes() for name in mixture.names}
    lengths = np.stack([table[name][index] for name, index in items]).astype(np.int64)
    return lengths, np.array([hashes[name][i] for name, i in items], dtype=np.uint64)


def start_mixture(path: str, n: int, seq_len: int) -> dict:
    from lumina.data.epoch_plan import plan_epoch
    from lumina.data.mixture import MixturePlan
    from lumina.data.noise import NoiseConfig, dropout_lengths

    sources = {name: ArraySource(int(f * n), seed) for seed, (name, f) in enumerate(MIX_SIZES.items())}
    mixture = MixturePlan(sources, MIX_WEIGHTS, seed=0, samples_per_epoch=n)
    hashes_of = {name: s.id_hashes() for name, s in sources.items()}
    plan_epoch(sources["web"].laid_out_lengths()[:1000, 0], seq_len, 0, 0)  # numba kernels loaded untimed,
    for dtype in (np.uint16, np.int64):  # the dropout kernel for either path's table type too
        dropout_lengths(synthetic_variants(10, dtype=dtype), np.zeros(10, np.uint64), NoiseConfig(), 0, 0)
    inputs = rss_mib()
    t0 = time.perf_counter()
    if path == "mix-before":
        stored, hashes = mixture_draw_before(mixture, 0)
    else:
        mix = mixture.epoch(0)
        stored, hashes = mixture.lengths(mix), mixture.gather(mix, hashes_of)
    t1 = time.perf_counter()
    lengths = dropout_lengths(stored, hashes, NoiseConfig(), 0, 0)
    t2 = time.perf_counter()
    plan = plan_epoch(lengths, seq_len, 0, 0)
    t3 = time.perf_counter()
    digest = plan.fingerprint()
    return {"draw_s": t1 - t0, "dropout_s": t2 - t1, "plan_s": t3 - t2, "total_s": time.perf_counter() - t0,
            "inputs_mib": inputs, "peak_mib": rss_mib(), "packs": plan.num_packs, "fingerprint": digest}


def mixture_section(n: int, seq_len: int) -> None:
    shares = ", ".join(f"{k} {int(f * n):,} samples weight {MIX_WEIGHTS[k]}" for k, f in MIX_SIZES.items())
    print(f"\nMixture epoch start: {n:,} slots over 3 sources ({shares}), seq_len {seq_len}; "
          "fresh process each\n")
    print("| path | draw + gather s | dropout s | plan s | total s | inputs MiB | peak MiB | packs | same plan |\n"
          "|---|---|---|---|---|---|---|---|---|")
    found = {}
    for path in ("mix-before", "mix-now"):
        out = subprocess.run([sys.executable, __file__, "--child", path, str(n), str(seq_len)], capture_output=True,
                             text=True, timeout=7200, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if out.returncode:
            print(out.stderr[-2000:])
            continue
        r = found[path] = json.loads(out.stdout.strip().splitlines()[-1])
        same = "" if path == "mix-before" else {True: "yes", False: "NO"}[
            r["fingerprint"] == found.get("mix-before", {}).get("fingerprint")]
        print(f"| {path.removeprefix('mix-')} | {r['draw_s']:.2f} | {r['dropout_s']:.2f} | {r['plan_s']:.2f} | "
              f"{r['total_s']:.2f} | {r['inputs_mib']:.0f} | {r['peak_mib']:.0f} | {r['packs']:,} | {same} |", flush=True)


# ---- fill ratio ----
def naive_fill(lengths: list[int], seq_len: int) -> float:
    kept = [n for n in lengths if n <= seq_len]
    return sum(kept) / (len(kept) * seq_len)


def next_fit_fill(lengths: list[int], seq_len: int) -> float:
    packs, room = 0, 0
    for n in lengths:
        if n > seq_len:
            continue
        if n > room:
            packs, room = packs + 1, seq_len
        room -= n
    return sum(n for n in lengths if n <= seq_len) / (packs * seq_len)


def fill_section(world_samples: int) -> None:
    from lumina.data.noise import NoiseConfig
    from lumina.data.packing import best_fit
    from lumina.data.sources import LayoutSource
    from lumina.world.dataset import build_world

    world = build_world("train", num_samples=world_samples, seed=0)
    cases = [("built-in world", LayoutSource(world.dataset, NoiseConfig(), seed=0).lengths(0).tolist()),
             ("log-normal synthetic", synthetic_variants(200_000)[:, 0].tolist())]
    print("\nFill ratio (sample tokens / pack tokens)\n")
    print("| lengths | seq_len | samples | mean len | packs | BFD fill | shuffled best-fit fill (default) | "
          "next-fit fill | naive pad fill |\n|---|---|---|---|---|---|---|---|---|")
    for name, lengths in cases:
        for seq_len in (4096, 16384):
            bfd = best_fit(lengths, seq_len, np.random.default_rng(0), "longest_first", overlong="skip")
            shuffled = best_fit(lengths, seq_len, np.random.default_rng(0), "shuffled", overlong="skip")
            print(f"| {name} | {seq_len} | {len(lengths):,} | {np.mean(lengths):.0f} | {shuffled.num_packs:,} | "
                  f"{bfd.fill_ratio:.4f} | **{shuffled.fill_ratio:.4f}** | {next_fit_fill(lengths, seq_len):.4f} | "
                  f"{naive_fill(lengths, seq_len):.4f} |", flush=True)


# ---- loader ----
def loader_rate(path: str, seq_len: int, workers: int, packs: int, repeats: int) -> tuple[float, float]:
    """Median (packs/s, tokens/s) of the DataModule's train loader over shards at `path`."""
    from lumina.data.datamodule import DataConfig, LuminaDataModule
    from lumina.data.noise import NoiseConfig
    from lumina.data.sources import LayoutSource
    from lumina.data.storage import ParquetSampleDataset

    dataset = ParquetSampleDataset(path, cache_row_groups=4)
    source = LayoutSource(dataset, NoiseConfig(), seed=0)
    rates, token_rates = [], []
    for _ in range(repeats):
        dm = LuminaDataModule(DataConfig(seq_len=seq_len, num_workers=workers, num_codebooks=dataset.tokens.num_codebooks,
                                         pad_id=dataset.tokens.pad, persistent_workers=False), source)
        n = min(packs, dm.schedule.plan(0).num_packs - 1)
        it = iter(dm.train_dataloader())
        next(it)
        tokens, t0 = 0, time.perf_counter()
        for _ in range(n):
            tokens += int(next(it).token_valid.sum())
        dt = time.perf_counter() - t0
        rates.append(n / dt)
        token_rates.append(tokens / dt)
        del it
    return statistics.median(rates), statistics.median(token_rates)


def loader_section(world_samples: int, packs: int, repeats: int) -> None:
    from s3_server import S3Server

    from lumina.cli.data import main as data_main

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "world"
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                data_main(["world", "--out", str(local), "--num-samples", str(world_samples), "--rows-per-shard", "256",
                           "--cache-dir", str(Path(tmp) / "cache")])
            finally:
                sys.stdout = stdout
        server = S3Server()
        server.start()
        try:
            server.upload(local, "bench", "world")
            print(f"\nLoader throughput: {world_samples} world samples in {len(list(local.glob('*.parquet')))} shards, "
                  "cache_row_groups 4\n")
            print("| store | seq_len | workers | packs/s | tokens/s | vs local 0 workers |\n|---|---|---|---|---|---|")
            for seq_len in (256, 2048):
                base = None
                for store, path in (("local", str(local)), ("loopback S3", "s3://bench/world")):
                    for workers in (0, 2, 4):
                        rate, tokens = loader_rate(path, seq_len, workers, packs, repeats)
                        base = base or rate
                        print(f"| {store} | {seq_len} | {workers} | {rate:.1f} | {tokens:,.0f} | {rate / base:.2f} |",
                              flush=True)
        finally:
            server.stop()


# ---- training step ----
def train_section(steps: int) -> None:
    import lightning as L
    from hydra import compose, initialize_config_dir

    from lumina.training import build

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.tokens: list[int] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            self.start = time.perf_counter()
            self.tokens.append(int(batch.token_valid.sum()))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            self.times.append(time.perf_counter() - self.start)

    print(f"\nTraining step consumption (median of steps 2-{steps}, 1 pack per step)\n")
    print("| config | seq_len | step s | packs/s | tokens/s (valid) |\n|---|---|---|---|---|")
    for name, overrides in (("default", []), ("learns_cpu", ["experiment=learns_cpu",
                                                             "data.sources.0.options.num_samples=2000"])):
        with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(config_dir=str(REPO / "conf"),
                                                                         version_base="1.3"):
            cfg = compose("train", overrides=[*overrides, f"trainer.max_steps={steps}", "logger=none",
                                              "callbacks.checkpoint=null", "callbacks.hf_export=null",
                                              "callbacks.progress_bar=null", "callbacks.expert_usage=null",
                                              "trainer.limit_val_batches=0", "trainer.enable_progress_bar=false",
                                              "trainer.enable_model_summary=false", f"paths.output_dir={tmp}"])
            L.seed_everything(0, verbose=False)
            module = build.module(cfg)
            datamodule = build.datamodule(cfg, module.model_config)
            timer = StepTimer()
            trainer = build.trainer(cfg, [*build.callbacks(cfg), timer], [])
            trainer.fit(module, datamodule=datamodule)
            step = statistics.median(timer.times[1:])
            tokens = statistics.median(timer.tokens[1:])
            print(f"| {name} | {cfg.data.seq_len} | {step:.3f} | {1 / step:.2f} | {tokens / step:,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    parser.add_argument("--before-max", type=float, default=1e6, help="largest size the old path runs at")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--world-samples", type=int, default=4000)
    parser.add_argument("--packs", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--mixture-samples", type=float, default=1e6)
    parser.add_argument("--sections", nargs="+", default=["start", "mixture", "fill", "loader", "train"])
    parser.add_argument("--child", nargs=3, metavar=("PATH", "N", "SEQ_LEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, n, seq_len = args.child[0], int(args.child[1]), int(args.child[2])
        if path.startswith("mix-"):
            print(json.dumps(start_mixture(path, n, seq_len)))
        else:
            print(json.dumps((start_now if path == "now" else start_before)(n, seq_len)))
        return
    if "start" in args.sections:
        epoch_start_section([int(n) for n in args.sizes], int(args.before_max), args.seq_len)
    if "mixture" in args.sections:
        mixture_section(int(args.mixture_samples), args.seq_len)
    if "fill" in args.sections:
        fill_section(args.world_samples)
    if "loader" in args.sections:
        loader_section(args.world_samples, args.packs, args.repeats)
    if "train" in args.sections:
        train_section(args.train_steps)


if __name__ == "__main__":
    main()
