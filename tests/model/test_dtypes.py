"""The one dtype table: every consumer (export, FSDP mixed precision, memory estimate, throughput, generate)
reads `lumina.model.dtypes`, and a bad name fails naming its field and value."""

from __future__ import annotations

import pytest
import torch

from lumina.checkpoint import resolve_dtype
from lumina.distributed.parallel_config import ParallelConfig
from lumina.model.dtypes import float_dtype, float_dtype_of_size
from lumina.training.memory_estimate import Precision
from lumina.training.throughput import compute_dtype


def test_names_and_short_spellings_map_to_torch_dtypes() -> None:
    assert float_dtype("f", "bfloat16") is torch.bfloat16 and float_dtype("f", "bf16") is torch.bfloat16
    assert float_dtype("f", "fp16") is torch.float16 and float_dtype("f", torch.float64) is torch.float64
    assert float_dtype_of_size(2) is torch.bfloat16 and float_dtype_of_size(8) is torch.float64
    assert resolve_dtype("keep") is None and resolve_dtype("fp32") is torch.float32


@pytest.mark.parametrize("make, field", [
    (lambda: ParallelConfig(param_dtype="bf17"), "ParallelConfig.param_dtype='bf17'"),
    (lambda: ParallelConfig(reduce_dtype="int8"), "ParallelConfig.reduce_dtype='int8'"),
    (lambda: resolve_dtype("half"), "dtype='half'"),
    (lambda: resolve_dtype(torch.int32), "dtype=torch.int32"),
    (lambda: Precision.of("32-true", "float8"), "param_dtype='float8'"),
])
def test_a_bad_name_names_its_field_and_value(make, field: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as error:
        make()
    assert str(error.value).startswith(field), str(error.value)


def test_precision_settings_read_the_table() -> None:
    assert [compute_dtype(p) for p in ("bf16-mixed", "16-mixed", "32-true", "64-true", "transformer-engine")] == [
        torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float32]
    assert Precision.of("32-true", "bfloat16").gathered_bytes == 2
    assert Precision.of("32-true", "bf16").activation_bytes == 2
    assert Precision.of("32-true", "float32").gathered_bytes == 4
