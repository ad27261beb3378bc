"""`lumina-data`: build and inspect sample shards, fit the built-in image tokenizer on your images.

`build` converts JSONL manifests (schema: `lumina.ingest.build_shards`) or an image folder (`lumina.ingest.imagefolder`:
OUT/train and OUT/val) to Parquet shards; image and video files are encoded by the visual tokenizer, saved
beside the shards (OUT/visual_tokenizer/, the text tokenizer as OUT/tokenizer.json) and recorded in them.
`tokenize-images` writes one official token file per image (DIR/<stem>.pkl, as the official
tools/tokenize_image.py); images keep their aspect ratio (long edge to --max-edge, sides centre-cropped to a
multiple of the patch). `--image-tokenizer atoken` drives the official AToken ($ATOKEN_CONFIG_PATH /
$ATOKEN_MODEL_PATH unless given). Manifests may be URLs (`lumina.files.fs`). `build`, `world` and
`fit-tokenizer` refuse a non-empty --out unless --overwrite and write it whole or not at all. Bad input ends
with one line `lumina-data: error: ...` and exit status 2; a store still failing after its retries, status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path


def _sizes(args: argparse.Namespace, visual: object | None) -> tuple[int, int]:
    """(codebook_size, num_codebooks): the visual tokenizer's, which explicit flags must agree with."""
    if visual is None:  # the official AToken files' sizes
        from lumina.tokenizers.token_files import ATOKEN_CODES

        return args.codebook_size or ATOKEN_CODES[1], args.num_codebooks or ATOKEN_CODES[0]
    for flag, given, own in (("--codebook-size", args.codebook_size, visual.codebook_size),
                             ("--num-codebooks", args.num_codebooks, visual.num_codebooks)):
        if given is not None and given != own:
            raise ValueError(f"{flag}={given} disagrees with the visual tokenizer {args.image_tokenizer} ({own})")
    return visual.codebook_size, visual.num_codebooks


def _tokens(args: argparse.Namespace, tokenizer: object | None, sizes: tuple[int, int], own_vocabulary: bool):
    from lumina.contract.special_tokens import SpecialTokens
    from lumina.tokenizers.text import newline_id, special_tokens_of

    codebook_size, num_codebooks = sizes
    newline = {} if args.newline_id is None else {"newline": args.newline_id}
    if args.special_tokens == "tokenizer" or own_vocabulary:
        if tokenizer is None:
            raise ValueError("--special-tokens tokenizer needs --tokenizer")
        return special_tokens_of(tokenizer, codebook_size, num_codebooks, **newline)
    newline = newline or {"newline": -1 if tokenizer is None else newline_id(tokenizer)}
    return SpecialTokens.official(**newline).replace(codebook_size=codebook_size, num_codebooks=num_codebooks)


def _progress(enabled: bool) -> Callable[[int], None] | None:
    """A frames-encoded counter on stderr (rich, refreshed by hand: no thread alive when workers fork)."""
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("encoding images: {task.completed} frames"), TimeElapsedColumn(),
                   console=Console(stderr=True), auto_refresh=False)
    task = bar.add_task("encode", total=None)
    bar.start()

    def advance(frames: int) -> None:
        bar.advance(task, frames)
        bar.refresh()
    return advance


def cmd_build(args: argparse.Namespace) -> int:
    from lumina.files.outputs import check_output, staged_output

    if bool(args.manifests) == bool(args.imagefolder):
        raise ValueError("give manifests or --imagefolder DIR (one of the two)")
    if args.imagefolder and not args.image_tokenizer:
        raise ValueError("--imagefolder needs --image-tokenizer builtin|atoken|DIR (a directory from fit-tokenizer)")
    inputs = [*args.manifests, *filter(None, (args.imagefolder, args.tokenizer, args.image_tokenizer))]
    check_output(args.out, args.overwrite, inputs)  # before any slow work
    with staged_output(args.out, args.overwrite, inputs) as stage:
        reports = _build_into(args, stage)
    for split, report in reports.items():
        for s in report.skipped:
            print(f"skipped {s.manifest}:{s.line}: {s.reason}", file=sys.stderr)
        unused = ", ".join(f"{k} ({n} lines)" for k, n in sorted(report.ignored_keys.items()))
        print(f"wrote {report.rows_written} rows to {len(report.shards)} shards in {Path(args.out) / split}; "
              f"skipped {report.rows_skipped} rows" + (f"; metadata keys not used: {unused}" if unused else ""))
    return 0


def _build_into(args: argparse.Namespace, out: Path) -> dict:
    from lumina.data.dataset_assets import TEXT_FILE, save_assets
    from lumina.ingest.build_shards import build_rows, build_shards
    from lumina.ingest.encode import PixelEncoder
    from lumina.ingest.imagefolder import caption_words, folder_splits
    from lumina.tokenizers.text import HFTokenizer, WordTokenizer, check_special_ids

    visual = _visual(args) if args.image_tokenizer else None
    text_path = args.tokenizer
    tokenizer = HFTokenizer(args.tokenizer) if args.tokenizer else None
    if args.imagefolder:
        rows, splits = folder_splits(args.imagefolder, [t for t in args.tasks.split(",") if t], args.val_fraction,
                                     args.split_seed, args.caption_prompt)
        if tokenizer is None:  # a vocabulary of the captions' own words
            tokenizer = WordTokenizer(caption_words(rows, args.caption_prompt))
            text_path = tokenizer.save(out / TEXT_FILE)
    tokens = _tokens(args, tokenizer, _sizes(args, visual), isinstance(tokenizer, WordTokenizer))
    if tokenizer is not None:
        check_special_ids(tokenizer, tokens)
    assets = save_assets(out, text_path, visual)
    pixels = None if visual is None else PixelEncoder(
        visual, args.batch_size, args.workers, _progress(sys.stderr.isatty() if args.progress is None
                                                         else args.progress), args.max_edge)
    common = dict(tokens=tokens, tokenizer=tokenizer, on_error=args.on_error, rows_per_shard=args.rows_per_shard,
                  source=args.source, pixels=pixels, assets=assets)
    if args.imagefolder:
        return {split: build_rows(split_rows_, out / split, **common) for split, split_rows_ in splits.items()}
    return {"": build_shards(args.manifests, out, **common)}


def _visual(args: argparse.Namespace):
    from lumina.tokenizers.registry import load_visual_tokenizer

    return load_visual_tokenizer(args.image_tokenizer, args.device, args.atoken_config, args.atoken_model,
                                 args.atoken_package)


def cmd_tokenize_images(args: argparse.Namespace) -> int:
    import torch

    from lumina.tokenizers.pixels import Preparation, image_files, read_image, to_signed
    from lumina.tokenizers.token_files import TokenFileError, read_token_file, token_file_dict

    visual = _visual(args)
    prep = Preparation(visual.image_size if args.max_edge is None else args.max_edge, visual.patch_size)
    files = image_files(args.images)
    stems = [f.stem for f in files]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise ValueError(f"image files share the stems {repeated}; each writes <stem>.pkl, so they would collide")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is an existing file; name a directory")
    todo = []
    for file in files:
        path = out / f"{file.stem}.pkl"
        if not path.exists():
            todo.append((file, path))
        elif not args.resume:
            raise ValueError(f"{path} exists; pass --resume to keep the token files already written and write "
                             "the rest, or name a new --out")
        else:  # kept only when complete and valid: files are renamed into place once written whole
            try:
                read_token_file(path, "image", visual.num_codebooks, visual.codebook_size)
            except TokenFileError as exc:
                raise ValueError(f"--resume: {exc}; remove it to have it written again") from exc
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(files) - len(todo)} token files kept, {len(todo)} to write")
    for file, path in todo:
        pixels = read_image(file, prep)
        codes, grid = visual.encode(to_signed(pixels[None]))
        partial = path.with_name(f".{path.name}.partial")
        torch.save(token_file_dict(codes[0], grid, image_size=pixels.shape[:2]), partial)
        partial.replace(path)  # never a half-written <stem>.pkl under its name
        print(f"saved={path} grid={grid[0]}x{grid[1]} token_length={codes.shape[1]}")
    return 0


def cmd_fit_tokenizer(args: argparse.Namespace) -> int:
    from lumina.files.outputs import check_output, staged_output
    from lumina.ingest.fit_tokenizer import fit_on_files
    from lumina.tokenizers.pixels import image_files
    from lumina.tokenizers.rvq_quantizer import RVQSettings

    settings = RVQSettings(patch_size=args.patch, codebook_size=args.codebook_size, num_codebooks=args.codebooks,
                           kmeans_iters=args.kmeans_iters, seed=args.seed)
    check_output(args.out, args.overwrite, args.images)
    files = image_files(args.images)
    tokenizer, report = fit_on_files(files, settings, args.image_size, args.heldout, args.max_patches, args.workers)
    with staged_output(args.out, args.overwrite, args.images) as stage:
        tokenizer.save(stage)
    held = report["heldout_psnr_db"]
    print(f"fitted {tokenizer.num_codebooks} codebooks of {tokenizer.codebook_size} codes (patch {tokenizer.patch_size}, "
          f"{tokenizer.image_size} px) on {report['train_images']} images -> {args.out}")
    print(f"reconstruction PSNR: held-out {report['heldout_images']} images "
          + ("n/a" if held is None else f"{held:.2f} dB") + f", train {report['train_psnr_db']:.2f} dB")
    return 0


def cmd_world(args: argparse.Namespace) -> int:
    from lumina.files.outputs import check_output, staged_output
    from lumina.tokenizers.rvq_quantizer import RVQSettings
    from lumina.world.dataset import build_world, round_trip_report

    rvq = RVQSettings(patch_size=args.patch_size, codebook_size=args.codebook_size,
                      num_codebooks=args.num_codebooks, seed=args.tokenizer_seed)
    out = check_output(args.out, args.overwrite)
    world = build_world(args.split, args.num_samples, args.seed, rvq=rvq, cache_dir=args.cache_dir)
    with staged_output(out, args.overwrite) as stage:
        shards = world.dataset.save(stage, rows_per_shard=args.rows_per_shard, prefix=f"world-{args.split}")
        world.text_tokenizer.save(stage / "tokenizer.json")
        world.image_tokenizer.save(stage / "image_tokenizer.safetensors")
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
        "special_tokens": dataclasses.asdict(ds.tokens), "tokenizers": ds.assets.to_json(),
        "laid_out_length": {c: {"min": int(lengths[:, k].min()), "mean": float(lengths[:, k].mean()),
                                "max": int(lengths[:, k].max())} for k, c in enumerate(LENGTH_COLUMNS)}
        if len(ds) else {},
    }, indent=2))
    return 0


def _image_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-edge", type=int, help="resize each image's long edge to N px before the centre crop to "
                   "multiples of the patch (0: keep the size; default: the tokenizer's image size)")
    p.add_argument("--atoken-config", help="AToken config yaml (default $ATOKEN_CONFIG_PATH)")
    p.add_argument("--atoken-model", help="AToken checkpoint (default $ATOKEN_MODEL_PATH)")
    p.add_argument("--atoken-package", help="the official checkout holding atoken_inference/ (default: PYTHONPATH)")
    p.add_argument("--device", help="where AToken runs (default cuda; it stops without CUDA unless set, e.g. cpu)")


def _overwrite_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (and remove what an "
                   "interrupted run left beside it); without it such an --out is refused")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lumina-data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="JSONL manifests or an image folder -> Parquet shards")
    b.add_argument("manifests", nargs="*")
    b.add_argument("--out", required=True)
    _overwrite_option(b)
    b.add_argument("--tokenizer", help="HF tokenizer.json for text parts given as strings")
    b.add_argument("--special-tokens", choices=("official", "tokenizer"), default="official",
                   help="official ids, or the ids the --tokenizer vocabulary defines")
    b.add_argument("--newline-id", type=int, help="the text id of '\\n' (the prompt template's newline after a "
                                                  "media line); default: the tokenizer's")
    b.add_argument("--codebook-size", type=int, help="default: the visual tokenizer's, else 4096")
    b.add_argument("--num-codebooks", type=int, help="default: the visual tokenizer's, else 8")
    b.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    b.add_argument("--rows-per-shard", type=int, default=4096)
    b.add_argument("--source", default="default", help="source name for rows without one")
    b.add_argument("--image-tokenizer", help="'builtin', 'atoken' or a directory from fit-tokenizer: encodes image "
                   "files")
    _image_options(b)
    b.add_argument("--batch-size", type=int, default=64, help="images per encode call")
    b.add_argument("--workers", type=int, default=0, help="processes reading image files (0: this one)")
    b.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr (default: when stderr is a terminal)")
    b.add_argument("--imagefolder", help="a folder of images + metadata.jsonl (file_name, text)")
    b.add_argument("--tasks", default="t2i,caption", help="imagefolder: samples made of each image")
    b.add_argument("--val-fraction", type=float, default=0.1, help="imagefolder: share of images held out")
    b.add_argument("--split-seed", type=int, default=0)
    b.add_argument("--caption-prompt", default="describe the image .", help="imagefolder: the caption task's prompt")
    b.set_defaults(func=cmd_build)
    t = sub.add_parser("tokenize-images", help="image files -> official token files (<stem>.pkl)")
    t.add_argument("images", nargs="+", help="image files or directories (PNG, JPEG, WebP, BMP)")
    t.add_argument("--out", required=True)
    t.add_argument("--resume", action="store_true", help="keep the valid <stem>.pkl files already in --out and "
                   "write the rest (without it an existing <stem>.pkl is refused)")
    t.add_argument("--image-tokenizer", default="atoken", help="'atoken' (default), 'builtin' or a directory")
    _image_options(t)
    t.set_defaults(func=cmd_tokenize_images)
    f = sub.add_parser("fit-tokenizer", help="fit the built-in image tokenizer on image files")
    f.add_argument("images", nargs="+", help="image files or directories (PNG, JPEG, WebP)")
    f.add_argument("--out", required=True)
    _overwrite_option(f)
    f.add_argument("--codebooks", type=int, default=4)
    f.add_argument("--codebook-size", type=int, default=64)
    f.add_argument("--patch", type=int, default=4)
    f.add_argument("--image-size", type=int, default=32, help="long edge the images are resized to; the "
                   "tokenizer's default --max-edge")
    f.add_argument("--heldout", type=float, default=0.1, help="share of images held out for the PSNR report")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--kmeans-iters", type=int, default=20)
    f.add_argument("--max-patches", type=int, default=200_000, help="patches sampled for k-means (seeded)")
    f.add_argument("--workers", type=int, default=0, help="processes reading image files")
    f.set_defaults(func=cmd_fit_tokenizer)
    w = sub.add_parser("world", help="write the built-in scene-world dataset")
    w.add_argument("--out", required=True)
    _overwrite_option(w)
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
    from lumina.files.fs import StoreError

    args = parser().parse_args(argv)
    try:
        code = args.func(args)
    except (ValueError, FileNotFoundError, KeyError, ImportError, StoreError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"lumina-data: error: {args.command}: {' | '.join(str(message).splitlines())}", file=sys.stderr)
        code = 1 if isinstance(exc, StoreError) else 2
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
