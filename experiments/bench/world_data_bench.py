"""Built-in dataset throughput: materialising the scene world and round-tripping it through Parquet.

Baseline (measured in the same process): `make_items` alone (task records, no pixels or tokens). Reported:
median seconds over `--repeats` runs and the ratio to the baseline, for
    build    build_world(n) with a cached image tokenizer (render + RVQ encode + tokenise + laid-out lengths)
    write    InMemorySampleDataset.save (Parquet, zstd)
    read     ParquetSampleDataset open + decode every row
Run: python experiments/bench/world_data_bench.py --num-samples 3000
"""

from __future__ import annotations

import argparse
import tempfile
import time

from timing import median_seconds

from lumina.data.storage import ParquetSampleDataset
from lumina.world.dataset import build_world, cached_world_image_tokenizer, round_trip_report
from lumina.world.tasks import make_items


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-samples", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.num_samples
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        tokenizer = cached_world_image_tokenizer(cache_dir=cache)
        fit = time.perf_counter() - start
        report = round_trip_report(tokenizer, "test")
        base = median_seconds(lambda: make_items("train", n), args.repeats, warmup=False)
        build = median_seconds(lambda: build_world("train", n, image_tokenizer=tokenizer), args.repeats, warmup=False)
        world = build_world("train", n, image_tokenizer=tokenizer)
        write = median_seconds(lambda: world.dataset.save(out), args.repeats, warmup=False)

        def read_all() -> None:
            ds = ParquetSampleDataset(out, world.tokens)
            for i in range(len(ds)):
                ds[i]

        read = median_seconds(read_all, args.repeats, warmup=False)
    print(f"tokenizer fit (default settings, once): {fit:.2f} s; test-split round trip: mse {report['mse']:.5f}, "
          f"checker pass rate {report['checker_pass_rate']:.3f}")
    print(f"n = {n}, median of {args.repeats}")
    print(f"baseline make_items : {base:.3f} s")
    for name, t in (("build_world", build), ("parquet write", write), ("parquet read all", read)):
        print(f"{name:<20}: {t:.3f} s  ({n / t:,.0f} samples/s, {t / base:.1f}x baseline)")


if __name__ == "__main__":
    main()
