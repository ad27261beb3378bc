"""`lumina-data`: build and inspect sample shards.

    lumina-data build MANIFEST.jsonl... --out DIR [--tokenizer tokenizer.json] [--special-tokens official|tokenizer]
                      [--codebook-size 4096] [--num-codebooks 8] [--on-error raise|skip] [--rows-per-shard N]
    lumina-data world --out DIR [--split train] [--num-samples 2000] [--seed 0] [--codebook-size 64]
                      [--num-codebooks 4] [--patch-size 4] [--cache-dir DIR]
    lumina-data info SHARD_OR_DIR...

`build` converts JSONL manifests (schema: `lumina.data.build`) to Parquet shards; `world` writes the built-in
dataset's shards plus its `tokenizer.json` and `image_tokenizer.safetensors`; `info` prints row counts,
settings and length statistics. Bad input ends the process with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def _tokens(args: argparse.Namespace, tokenizer: object | None):
    from lumina.data.special_tokens import SpecialTokens
    from lumina.data.tokenizers.text import special_tokens_of

    if args.special_tokens == "tokenizer":
        if tokenizer is None:
            raise ValueError("--special-tokens tokenizer needs --tokenizer")
        return special_tokens_of(tokenizer, args.codebook_size, args.num_codebooks)
    return SpecialTokens.official().replace(codebook_size=args.codebook_size, num_codebooks=args.num_codebooks)


def cmd_build(args: argparse.Namespace) -> int:
    from lumina.data.build import build_shards
    from lumina.data.tokenizers.text import HFTokenizer

    tokenizer = HFTokenizer(args.tokenizer) if args.tokenizer else None
    report = build_shards(args.manifests, args.out, _tokens(args, tokenizer), tokenizer=tokenizer,
                          on_error=args.on_error, rows_per_shard=args.rows_per_shard, source=args.source)
    for s in report.skipped:
        print(f"skipped {s.manifest}:{s.line}: {s.reason}", file=sys.stderr)
    print(f"wrote {report.rows_written} rows to {len(report.shards)} shards in {args.out}; "
          f"skipped {report.rows_skipped} rows")
    return 0


def cmd_world(args: argparse.Namespace) -> int:
    from lumina.data.tokenizers.image_rvq import RVQSettings
    from lumina.data.world.dataset import build_world, round_trip_report

    rvq = RVQSettings(patch_size=args.patch_size, codebook_size=args.codebook_size,
                      num_codebooks=args.num_codebooks, seed=args.tokenizer_seed)
    world = build_world(args.split, args.num_samples, args.seed, rvq=rvq, cache_dir=args.cache_dir)
    out = Path(args.out)
    shards = world.dataset.save(out, rows_per_shard=args.rows_per_shard, prefix=f"world-{args.split}")
    world.text_tokenizer.save(out / "tokenizer.json")
    world.image_tokenizer.save(out / "image_tokenizer.safetensors")
    print(f"wrote {len(world.dataset)} {args.split} samples to {len(shards)} shards in {out}")
    report = round_trip_report(world.image_tokenizer, args.split)
    print(f"image tokenizer round trip on {args.split} scenes: mse {report['mse']:.5f} "
          f"(pixel variance {report['pixel_variance']:.3f}), checker pass rate {report['checker_pass_rate']:.3f}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from lumina.data.storage import LENGTH_COLUMNS, ParquetSampleDataset

    ds = ParquetSampleDataset(args.paths)
    lengths = ds.laid_out_lengths()
    print(json.dumps({
        "shards": [str(p) for p in ds.paths], "rows": len(ds),
        "special_tokens": dataclasses.asdict(ds.tokens),
        "laid_out_length": {c: {"min": int(lengths[:, k].min()), "mean": float(lengths[:, k].mean()),
                                "max": int(lengths[:, k].max())} for k, c in enumerate(LENGTH_COLUMNS)}
        if len(ds) else {},
    }, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lumina-data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="JSONL manifests -> Parquet shards")
    b.add_argument("manifests", nargs="+")
    b.add_argument("--out", required=True)
    b.add_argument("--tokenizer", help="HF tokenizer.json for text parts given as strings")
    b.add_argument("--special-tokens", choices=("official", "tokenizer"), default="official",
                   help="official ids, or the ids the --tokenizer vocabulary defines")
    b.add_argument("--codebook-size", type=int, default=4096)
    b.add_argument("--num-codebooks", type=int, default=8)
    b.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    b.add_argument("--rows-per-shard", type=int, default=4096)
    b.add_argument("--source", default="default", help="source name for rows without one")
    b.set_defaults(func=cmd_build)
    w = sub.add_parser("world", help="write the built-in scene-world dataset")
    w.add_argument("--out", required=True)
    w.add_argument("--split", default="train", choices=("train", "val", "test"))
    w.add_argument("--num-samples", type=int, default=2000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--codebook-size", type=int, default=64)
    w.add_argument("--num-codebooks", type=int, default=4)
    w.add_argument("--patch-size", type=int, default=4)
    w.add_argument("--tokenizer-seed", type=int, default=0)
    w.add_argument("--rows-per-shard", type=int, default=4096)
    w.add_argument("--cache-dir")
    w.set_defaults(func=cmd_world)
    i = sub.add_parser("info", help="summarise shards")
    i.add_argument("paths", nargs="+")
    i.set_defaults(func=cmd_info)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"lumina-data {args.command}: error: {' | '.join(str(exc).splitlines())}", file=sys.stderr)
        code = 2
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
