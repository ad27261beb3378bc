"""`lumina-train estimate_memory=true [memory_budget_gib=20]`: the step-memory estimate
(`lumina.training.memory_estimate`) of a composed config, printed as a table, with the fit verdict."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lumina.distributed.parallel_config import ParallelConfig
from lumina.model.supervision import PackRows
from lumina.training.build import model_config, model_freeze, plain
from lumina.training.errors import ConfigError
from lumina.training.memory_estimate import GIB, PACK_KEYS, MemoryEstimate, Precision, estimate_step_memory
from lumina.training.module import build_adapter


def memory_budget_gib(cfg: Any) -> float | None:
    """cfg.memory_budget_gib: None or a positive number of GiB; anything else raises ConfigError naming it."""
    value = cfg.get("memory_budget_gib")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"memory_budget_gib={value!r}: must be a positive number of GiB (or null)")
    return float(value)


def estimate_from_cfg(cfg: Any) -> MemoryEstimate:
    """The estimate of a composed lumina-train config (model, data.seq_len, trainer.precision, AdamW,
    strategy.parallel). Under sequence parallelism it is that of a pack of seq_len / sp rows (heads / sp over
    all rows cost what all heads over a rank's own rows would)."""
    config = model_config(cfg)
    seq_len = cfg.data.seq_len
    pack = plain(cfg.get("memory_pack")) or {}
    unknown = sorted(set(pack) - set(PACK_KEYS))
    if unknown:
        raise ConfigError(f"memory_pack.{unknown[0]}: unknown key (expected one of {PACK_KEYS})")
    policy, shard, ep, sp, param_dtype = config.gradient_checkpointing, 1, 1, 1, None
    parallel = (cfg.get("strategy") or {}).get("parallel")
    if parallel is not None:
        try:
            sizes = ParallelConfig.from_mapping(plain(parallel)).resolve(_world_size(cfg.trainer))
        except ValueError as error:
            raise ConfigError(str(error)) from error
        shard, ep, sp, param_dtype = sizes.shard, sizes.ep, sizes.sp, parallel.get("param_dtype")
    seq_len = -(-seq_len // sp)  # this rank's rows
    rows = PackRows.assume(seq_len, **pack)
    precision = Precision.of(cfg.trainer.get("precision", "32-true"), param_dtype)
    estimate = estimate_step_memory(config, seq_len, policy, rows, precision, "adamw", shard, ep,
                                    freeze=model_freeze(cfg),
                                    adapter=build_adapter(plain(cfg.get("adapter")) or {}))
    return replace(estimate, sp=sp)


def _world_size(trainer: Any) -> int:
    """trainer.devices x trainer.num_nodes (a device list counts its entries)."""
    devices, nodes = plain(trainer.get("devices", 1)), trainer.get("num_nodes", 1)
    if isinstance(devices, list):
        devices = len(devices)
    if isinstance(devices, bool) or not isinstance(devices, int) or not isinstance(nodes, int):
        raise ValueError(f"trainer.devices={devices!r}, trainer.num_nodes={nodes!r}: the memory estimate "
                         "needs integer device counts")
    return devices * nodes


def report_memory(cfg: Any) -> MemoryEstimate:
    """Print the estimate of `cfg` (and the verdict against memory_budget_gib); raise ConfigError naming the
    budget when the peak does not fit it."""
    budget = memory_budget_gib(cfg)
    estimate = estimate_from_cfg(cfg)
    print(estimate.table(budget), flush=True)
    if budget is not None and not estimate.fits(budget):
        raise ConfigError(f"memory_budget_gib={budget:g}: the estimated peak {estimate.peak / GIB:.2f} GiB "
                          f"does not fit (data.seq_len={estimate.seq_len}, "
                          f"gradient_checkpointing={estimate.policy})")
    return estimate
