"""Process-wide glibc heap settings, applied once by the entry points (`lumina-*`, experiments/bench).

glibc serves allocations above its mmap threshold (32 MiB at most) with fresh mmaps and returns them on free,
so every large CPU tensor page-faults its memory in again (about 25 ms per 64 MiB on a 2-core host). Serving
every allocation from the heap and keeping freed memory for reuse removes those faults for the whole process;
the cost is that RSS no longer shrinks after a peak. GPU memory is unaffected (the caching allocator)."""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_heap_memory() -> bool:
    """mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) -> whether glibc took both. Left alone
    (False) where the user set glibc's malloc variables, or where the C library has no mallopt."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
