"""`ParallelConfig`: the sizes and switches of the FSDP2 + expert-parallel layout (Hydra: conf/strategy/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lumina.model.dtypes import float_dtype
from lumina.model.supervision import int_at_least

# keys that went away, and what to use instead
REMOVED = {
    "activation_checkpointing": "model.config.gradient_checkpointing=full (the one checkpointing knob)",
    "conditional_rule": "nothing: every conditional module always joins every rank's graph",
}


@dataclass
class ParallelConfig:
    """world = replicate * shard ranks.

    replicate:  HSDP replicas (outer dim of both meshes); 1 = plain FSDP.
    shard:      FSDP shard size of the dense parameters; "auto" = world // replicate.
    ep:         expert-parallel size (divides `shard` and num_experts); experts are split over the ep ranks,
                FSDP-sharded over the remaining shard // ep ("expert fsdp") ranks.
    sp:         sequence-parallel size (divides the world and num_attention_heads): `sp` consecutive ranks share
                one pack, each holding S/sp of its rows; the data-parallel size is world // sp.
    param_dtype / reduce_dtype: FSDP2 MixedPrecisionPolicy (null param_dtype = fp32 compute; trainer
                precision stays "32-true").
    participation_check: before backward, raise when ranks disagree on which conditional modules ran.
    timeout_s:  process-group timeout: after it a dead or diverged rank ends the job with an error.
    """

    replicate: int = 1
    shard: int | str = "auto"
    ep: int = 1
    sp: int = 1
    param_dtype: str | None = None
    reduce_dtype: str = "float32"
    participation_check: bool = True
    timeout_s: float = 1800.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ParallelConfig:
        """From `strategy.parallel`: a removed or unknown key raises ValueError naming it (and what to use)."""
        for key in values:
            if key in REMOVED:
                raise ValueError(f"strategy.parallel.{key} was removed; use {REMOVED[key]}")
            if key not in {f.name for f in fields(cls)}:
                raise ValueError(f"strategy.parallel.{key}: unknown key (expected one of "
                                 f"{[f.name for f in fields(cls)]})")
        return cls(**values)

    def __post_init__(self) -> None:
        for name in ("replicate", "ep", "sp"):
            int_at_least(f"ParallelConfig.{name}", getattr(self, name), 1)
        if self.shard != "auto":
            int_at_least("ParallelConfig.shard", self.shard, 1)
        if self.param_dtype is not None:
            float_dtype("ParallelConfig.param_dtype", self.param_dtype)
        float_dtype("ParallelConfig.reduce_dtype", self.reduce_dtype)
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            raise ValueError(f"ParallelConfig.timeout_s={self.timeout_s!r}: must be a positive number of seconds")

    def resolve(self, world_size: int) -> ResolvedSizes:
        """Check the sizes against the world size -> (replicate, shard, expert_fsdp, ep, sp)."""
        if world_size % self.replicate:
            raise ValueError(f"ParallelConfig.replicate={self.replicate} does not divide the world size {world_size}")
        shard = world_size // self.replicate if self.shard == "auto" else int(self.shard)
        if self.replicate * shard != world_size:
            raise ValueError(f"ParallelConfig: replicate={self.replicate} x shard={shard} = "
                             f"{self.replicate * shard} ranks, but the world size is {world_size}")
        if shard % self.ep:
            raise ValueError(f"ParallelConfig.ep={self.ep} does not divide shard={shard} (expert parallelism "
                             "runs inside one FSDP shard group)")
        if world_size % self.sp:
            raise ValueError(f"ParallelConfig.sp={self.sp} does not divide the world size {world_size} (a pack "
                             "is shared by sp consecutive ranks)")
        return ResolvedSizes(self.replicate, shard, shard // self.ep, self.ep, self.sp)


@dataclass(frozen=True)
class ResolvedSizes:
    replicate: int
    shard: int
    expert_fsdp: int
    ep: int
    sp: int = 1

    @property
    def world_size(self) -> int:
        return self.replicate * self.shard

    @property
    def dp(self) -> int:
        """Data-parallel size: ranks that train different packs."""
        return self.world_size // self.sp
