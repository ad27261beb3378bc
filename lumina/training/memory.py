"""`peak_memory_gib`: the peak memory of this process on its device, in GiB (logged as train/peak_mem_gib)."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: the caching allocator's peak allocated bytes on `device`; any other device: the process's peak
    resident set size (ru_maxrss: KiB on Linux, bytes on macOS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20
