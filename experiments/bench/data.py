"""The data path at scale: epoch start (CFG dropout + plan) beside the packer lumina had before, fill ratio,
and the packed loader's throughput from local disk and from a loopback S3 store next to what a training step
consumes.

    python experiments/bench/data.py [--sizes 1e6 1e7 1e8] [--before-max 1e6] [--seq-len 16384]
        [--world-samples 4000] [--packs 40] [--repeats 3] [--sections start fill loader train]

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

Measured 2026-12-02 on the shared 2-core CPU (load average 4-6 from other jobs), defaults:
see experiments/bench/README-data.md for the tables of the last run.
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
    from lumina.data.noise import NoiseConfig, dropout_lengths
    from lumina.data.plan import plan_epoch

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
            "inputs_mib": inputs, "peak_mib": rss_mib(), "packs": plan.num_packs, "fill": plan.fill_ratio}


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
    from lumina.data.world.dataset import build_world

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
    parser.add_argument("--sections", nargs="+", default=["start", "fill", "loader", "train"])
    parser.add_argument("--child", nargs=3, metavar=("PATH", "N", "SEQ_LEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, n, seq_len = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps((start_now if path == "now" else start_before)(n, seq_len)))
        return
    if "start" in args.sections:
        epoch_start_section([int(n) for n in args.sizes], int(args.before_max), args.seq_len)
    if "fill" in args.sections:
        fill_section(args.world_samples)
    if "loader" in args.sections:
        loader_section(args.world_samples, args.packs, args.repeats)
    if "train" in args.sections:
        train_section(args.train_steps)


if __name__ == "__main__":
    main()
