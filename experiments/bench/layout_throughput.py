"""Layout throughput: `layout_sample` and `laid_out_length` against a copy baseline, medians of repeats.

Baseline (same process): allocating and filling the same rows with no logic: one [L, C] int64 tensor copied
from a prebuilt one plus the eight per-row metadata tensors. ratio = layout time / baseline time.
Run: python experiments/bench/layout_throughput.py
"""

from __future__ import annotations

import torch
from timing import median_seconds

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import laid_out_length, layout_sample


def baseline(reference: torch.Tensor) -> None:
    n = reference.shape[0]
    reference.clone()
    torch.full_like(reference, -100)
    for dtype in (torch.long, torch.long, torch.long, torch.long, torch.bool, torch.float32, torch.bool):
        torch.zeros(n, dtype=dtype)


def codes(n: int) -> torch.Tensor:
    return torch.randint(0, 4096, (n, 8))


def main() -> None:
    torch.set_num_threads(1)
    tokens, cfg = SpecialTokens.official(), NoiseConfig()
    cases = {
        "text QA (64 prompt, 2047 answer)": Sample("qa", [Turn("user", [Text(list(range(64)))]),
                                                          Turn("assistant", [Text(list(range(100, 2147)))])]),
        "understanding (32x32 image, 511 answer)": Sample("mmu", [
            Turn("user", [Media("image", codes(1024), (32, 32)), Text(list(range(32)))]),
            Turn("assistant", [Text(list(range(100, 611)))])]),
        "T2I (64 prompt, 64x64 grid)": Sample("t2i", [Turn("user", [Text(list(range(64)))]),
                                                      Turn("assistant", [Media("image", codes(4096), (64, 64))])]),
    }
    print(f"{'case':42s} {'rows':>6s} {'layout ms':>10s} {'baseline ms':>12s} {'ratio':>6s} "
          f"{'length us':>10s} {'layout/length':>14s}")
    for name, sample in cases.items():
        seq = layout_sample(sample, tokens, cfg, 0, 0)
        t_layout = median_seconds(lambda s=sample: layout_sample(s, tokens, cfg, 0, 0), 30)
        t_base = median_seconds(lambda r=seq.input_ids: baseline(r), 30)
        t_len = median_seconds(lambda s=sample: laid_out_length(s, tokens), 30)
        print(f"{name:42s} {len(seq):6d} {t_layout * 1e3:10.3f} {t_base * 1e3:12.3f} {t_layout / t_base:6.1f} "
              f"{t_len * 1e6:10.1f} {t_layout / t_len:14.1f}")


if __name__ == "__main__":
    main()
