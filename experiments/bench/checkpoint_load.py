"""Peak host memory of loading an HF checkpoint, as a multiple of the checkpoint's bytes.

    python experiments/bench/checkpoint_load.py [--hidden 512] [--experts 32] [--layers 4] [--reps 3]

Writes one split-layout fp32 checkpoint of a mid-sized config, then loads it in fresh processes (one per
method and repetition) and reports, per method, the median of (peak RSS - RSS before loading) / checkpoint
bytes. Methods:
  stream_meta          `load_pretrained`: meta-initialised model, shard-by-shard assignment (lumina)
  stream_materialised  built model (random init) + `load_hf_state_dict_into` (in-place copy, lumina)
  naive                built model + read every shard with `load_file`, stack the experts, `load_state_dict`
  convert_fused        `convert_checkpoint` split -> fused into a temporary directory (no model at all)
The ideal for loading is 1.0 (one copy of the weights); conversion should hold about one output shard.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def current_rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(method: str, directory: Path) -> None:
    from safetensors.torch import load_file

    from lumina.checkpoint import (
        HFCheckpoint,
        load_hf_state_dict_into,
        load_pretrained,
        parse_split_expert_key,
    )
    from lumina.model import LuminaModel

    config = HFCheckpoint(directory).config()
    LuminaModel(config.tiny())  # warm-up: first construction loads code and kernels (~70 MB, size-independent)
    with torch.device("meta"):
        LuminaModel(config.tiny())
    reset_peak_rss()  # the warm-up's own transient peak must not count
    before = current_rss_bytes()
    if method == "convert_fused":
        from lumina.checkpoint import convert_checkpoint

        with tempfile.TemporaryDirectory() as out:
            convert_checkpoint(directory, out, layout="fused", max_shard_size="64MB")
        print(json.dumps({"extra_peak": peak_rss_bytes() - before}))
        return
    if method == "stream_meta":
        model = load_pretrained(directory)
    else:
        model = LuminaModel(config)
        if method == "stream_materialised":
            load_hf_state_dict_into(model, directory)
        else:
            state, slices = {}, {}
            for path in sorted(directory.glob("*.safetensors")):
                for key, tensor in load_file(path).items():
                    parsed = parse_split_expert_key(key)
                    if parsed is None:
                        state[key] = tensor
                    else:
                        slices.setdefault(parsed[0], {})[parsed[1]] = tensor
            for key, parts in slices.items():
                state[key] = torch.stack([parts[e] for e in range(len(parts))])
            model.load_state_dict(state)
            del state, slices
    assert sum(p.numel() for p in model.parameters()) > 0
    print(json.dumps({"extra_peak": peak_rss_bytes() - before}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "DIR"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return

    from lumina.checkpoint import save_pretrained
    from lumina.model import LuminaConfig, LuminaModel

    config = LuminaConfig.tiny(hidden_size=args.hidden, num_hidden_layers=args.layers, num_experts=args.experts,
                               n_group=4, topk_group=2, num_experts_per_tok=4, moe_intermediate_size=args.hidden,
                               intermediate_size=2 * args.hidden, vocab_size=4096, codebook_size=256)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        torch.manual_seed(0)
        model = LuminaModel(config)
        save_pretrained(model, directory, max_shard_size="64MB")
        ckpt_bytes = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
        del model
        print(f"checkpoint: {ckpt_bytes / 2**20:.0f} MiB in {len(list(directory.glob('*.safetensors')))} shards "
              f"(hidden {args.hidden}, {args.experts} experts, {args.layers} layers, fp32)")
        for method in ("stream_meta", "stream_materialised", "naive", "convert_fused"):
            ratios = []
            for _ in range(args.reps):
                done = subprocess.run([sys.executable, __file__, "--worker", method, str(directory)],
                                      capture_output=True, text=True, check=True)
                ratios.append(json.loads(done.stdout.strip().splitlines()[-1])["extra_peak"] / ckpt_bytes)
            print(f"{method:20s} peak extra memory = {statistics.median(ratios):.2f} x checkpoint bytes "
                  f"(median of {args.reps}: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
