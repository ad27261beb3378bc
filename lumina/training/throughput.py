"""Achieved FLOP/s and MFU of each optimizer step, and the analytic FLOPs in the model summary.

`ThroughputCallback` logs per optimizer step `train/flops` (summed over ranks), `train/tflops` (per device,
first micro-batch start to step end, mean over ranks) and `train/mfu` (over the configured peak, else a known
GPU's dense bf16 peak, else a CPU GEMM probe). `FlopsModelSummary` shows the analytic training FLOPs of one
nominal pack (`data.seq_len` tokens, `memory_pack`'s fractions): a sharded model cannot run a probe forward.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary

from lumina.contract.batch import PackedBatch
from lumina.model.config import LuminaConfig
from lumina.model.dtypes import FLOAT_DTYPES
from lumina.model.flops import batch_flops, nominal_attention_pairs, training_flops
from lumina.model.supervision import PackRows

log = logging.getLogger(__name__)

# dense bf16 / fp16 tensor-core peaks in TFLOP/s (NVIDIA datasheets; the "with sparsity" figures are twice these)
PEAK_BF16_TFLOPS = {"H200 NVL": 835.0, "H200": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
                    "A100": 312.0}


def compute_dtype(precision: object) -> torch.dtype:
    """The GEMM dtype of a Lightning precision setting ("32-true", "bf16-mixed", "16-mixed", ...)."""
    name = str(precision)
    return FLOAT_DTYPES.get("bf16" if "bf16" in name else "fp" + name.split("-")[0], torch.float32)


def table_peak_tflops(device_name: str, dtype: torch.dtype) -> float | None:
    """The dense bf16/fp16 peak of a known GPU (first table key in its name); None for others."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for chip, peak in PEAK_BF16_TFLOPS.items():
        if chip.lower() in device_name.lower():
            return peak
    return None


def gemm_probe_tflops(dtype: torch.dtype = torch.float32, size: int = 1024, repeats: int = 5) -> float:
    """The best CPU TFLOP/s of `repeats` [size, size] x [size, size] products in `dtype` (after a warm-up)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def _attn_backend(pl_module: L.LightningModule) -> str:
    return pl_module.model.model.attn_backend  # resolved from "auto" when the model was built


class ThroughputCallback(L.Callback):
    """peak_tflops: the device's peak in TFLOP/s (None = the GPU table, else the CPU probe when `probe`)."""

    def __init__(self, peak_tflops: float | None = None, probe: bool = True) -> None:
        if peak_tflops is not None and (isinstance(peak_tflops, bool) or not isinstance(peak_tflops, int | float)
                                        or not peak_tflops > 0):
            raise ValueError(f"callbacks.throughput.peak_tflops={peak_tflops!r}: must be a number > 0 or null")
        self.configured_peak = peak_tflops
        self.probe = probe
        self.peak_tflops: float | None = None
        self.peak_source = "none"
        self._flops = 0
        self._t0: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dtype = compute_dtype(trainer.precision)
        device = pl_module.device
        if self.configured_peak is not None:
            self.peak_tflops, self.peak_source = float(self.configured_peak), "configured"
        elif device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            self.peak_tflops, self.peak_source = table_peak_tflops(name, dtype), f"{name} {dtype} table"
        elif device.type == "cpu" and self.probe:
            self.peak_tflops = gemm_probe_tflops(dtype)
            self.peak_source = f"CPU GEMM probe, {dtype}, {torch.get_num_threads()} threads"
        if trainer.is_global_zero:
            peak = "unknown (no train/mfu)" if self.peak_tflops is None else f"{self.peak_tflops:.4g} TFLOP/s"
            log.info("MFU peak: %s (%s)", peak, self.peak_source)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not isinstance(batch, PackedBatch):  # a post-training step (rollouts + scoring) is no pack: uncounted
            return
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self._flops += batch_flops(pl_module.model_config, batch, _attn_backend(pl_module))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not getattr(pl_module, "step_completed", False) or not isinstance(batch, PackedBatch):
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        step = torch.tensor([self._flops, self._flops / max(elapsed, 1e-9) / 1e12], dtype=torch.float64,
                            device=pl_module.device)
        self._flops, self._t0 = 0, None
        flops = trainer.strategy.reduce(step[0], reduce_op="sum").item()
        scalars = {"train/flops": flops, "train/tflops": trainer.strategy.reduce(step[1], reduce_op="mean").item()}
        if self.peak_tflops:
            scalars["train/mfu"] = scalars["train/tflops"] / self.peak_tflops
        pl_module.log_dict(scalars, on_step=True, on_epoch=False, batch_size=1)


class _AnalyticSummary(ModelSummary):
    """Lightning's summary with the FLOPs of the `model` row and the total given, not measured."""

    def __init__(self, model: L.LightningModule, max_depth: int, flops: int) -> None:
        self._analytic_flops = flops
        super().__init__(model, max_depth=max_depth)

    @property
    def total_flops(self) -> int:
        return self._analytic_flops

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        return {name: {"analytic": self._analytic_flops} if name == "model" else {} for name in self.layer_names}


class FlopsModelSummary(RichModelSummary):
    """seq_len: tokens per pack (`data.seq_len`); pack: `memory_pack`'s fractions (conf/train.yaml)."""

    def __init__(self, seq_len: int, pack: Mapping[str, Any] | None = None, max_depth: int = 1,
                 **summarize_kwargs: Any) -> None:
        super().__init__(max_depth=max_depth, **summarize_kwargs)
        self.rows = PackRows.assume(seq_len, **dict(pack or {}))
        self.seq_len = seq_len
        self.flops = 0

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> ModelSummary:
        config: LuminaConfig = pl_module.model_config
        backend = _attn_backend(pl_module)
        self.flops = training_flops(config, self.rows, nominal_attention_pairs(self.rows, backend))
        if trainer.is_global_zero:
            log.info("FLOPs in the model summary: analytic training FLOPs (forward + backward) of one pack of %d "
                     "tokens (%d text and %d image rows supervised, %s attention over samples of %d); train/tflops "
                     "and train/mfu come from the real packs", self.seq_len, self.rows.text, self.rows.image,
                     backend, self.rows.segment_len)
        return _AnalyticSummary(pl_module, self._max_depth, self.flops)
