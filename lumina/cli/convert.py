"""`lumina-convert SRC DST --layout split|fused [--dtype bf16|keep] [--max-shard-size 5GB]`: rewrite an HF
checkpoint directory in the other expert layout (streaming, shard by shard). Mistakes end it with one line,
`lumina-convert: error: ...` (`lumina.cli.errors`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lumina-convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="source HF checkpoint directory (split, fused or mixed expert layout)")
    parser.add_argument("dst", help="output directory")
    parser.add_argument("--layout", choices=("split", "fused"), default="split",
                        help="split: llada2_moe, what the official loader accepts (default); fused: llada2_moe_veomni")
    parser.add_argument("--dtype", choices=("keep", "bf16", "fp16", "fp32"), default="keep",
                        help="keep every tensor's dtype (default), or cast parameters (buffers keep official dtypes)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest shard, e.g. 5GB, 500MB, 2GiB (default 5GB)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DST (refused without it)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    # imported after parsing, so that --help and usage errors skip the torch import
    from lumina.checkpoint import convert_checkpoint
    from lumina.cli.errors import reporting

    with reporting("lumina-convert"):  # bad checkpoint or arguments: one line naming them, exit status 2
        out = convert_checkpoint(args.src, args.dst, layout=args.layout, dtype=args.dtype,
                                 max_shard_size=args.max_shard_size, overwrite=args.overwrite)
    print(f"wrote {args.layout} checkpoint to {out}")


if __name__ == "__main__":
    main()
