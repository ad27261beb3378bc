"""The one table of floating-point dtype names a config, CLI or export may give."""

from __future__ import annotations

import torch

# config.json / strategy spellings first (their order picks `float_dtype_of_size`'s answer), then short ones
FLOAT_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
    "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64,
}


def float_dtype(field: str, value: str | torch.dtype) -> torch.dtype:
    """A name of FLOAT_DTYPES (or a floating-point torch dtype) -> the torch dtype; ValueError naming `field`."""
    if isinstance(value, torch.dtype):
        if not value.is_floating_point:
            raise ValueError(f"{field}={value}: must be a floating-point dtype")
        return value
    if not isinstance(value, str) or value not in FLOAT_DTYPES:
        raise ValueError(f"{field}={value!r}: expected one of {sorted(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[value]


def float_dtype_of_size(nbytes: int) -> torch.dtype:
    """The first dtype of FLOAT_DTYPES with `nbytes` bytes per element (2 -> bfloat16)."""
    return next(d for d in FLOAT_DTYPES.values() if d.itemsize == nbytes)
