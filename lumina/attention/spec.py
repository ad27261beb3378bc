"""`AttentionSpec`: everything attention needs about one packed batch, validated and built once per forward.

The model calls `build_spec(batch)` once; every layer passes the same spec to `attend`. All host work (the
segment bounds, the rule-set choice, validation) happens here; backends cache their masks/tables lazily in
`spec.cache`, keyed per dtype, so the first layer builds them and the rest reuse them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lumina.attention.bounds import check_bounds, resolve_seg_bounds
from lumina.attention.rules import rules_allow, segment_ids
from lumina.attention.runs import Run, group_runs
from lumina.data.batch import PackedBatch

BACKENDS = ("sdpa_dense", "segmented", "flex", "flash_varlen")
PLAN_BACKENDS = ("segmented", "flex", "flash_varlen")  # segmented serves them or is their fallback
STRICT_ENV = "LUMINA_ATTN_STRICT"
ALLOWED_CHUNK = 1 << 24  # elements per rule evaluation chunk (bounds the temporaries of `allowed`)


@dataclass(eq=False)
class AttentionSpec:
    """Per-token vectors ([1, S]) plus host facts of one pack.

    bounds: segment bounds (cu_seqlens on the host); positions >= bounds[-1] are tail padding.
    seg_id: segment index per position (tail = number of segments). full_rules: rules R1-R8, else S1-S3.
    num_invalid: positions with token_valid false (such rows attend nothing).
    runs: adjacent equal-length segments grouped; run_plain: per run, whether the rule allows every pair
    inside it (computed in build_spec for the backends that use it, else None).
    """

    backend: str
    strict: bool
    bounds: tuple[int, ...]
    seg_id: torch.Tensor
    valid: torch.Tensor
    type_ids: torch.Tensor
    turn_ids: torch.Tensor
    block_ids: torch.Tensor
    is_clean: torch.Tensor
    full_rules: bool
    num_invalid: int
    runs: tuple[Run, ...] = ()
    run_plain: tuple[bool, ...] | None = None
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def seq_len(self) -> int:
        return self.valid.shape[1]

    @property
    def has_invalid(self) -> bool:
        return self.num_invalid > 0

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False))

    def run_allowed(self, run: Run) -> torch.Tensor:
        """[m, 1, L, L] bool rule slices of the run's m segments."""
        starts = range(run.start, run.start + run.size, run.length)
        return torch.stack([self.allowed(slice(s, s + run.length), slice(s, s + run.length)) for s in starts])

    def plain_flags(self) -> torch.Tensor:
        """[n_runs] bool on device: the rule allows every pair inside every segment of the run."""
        return torch.stack([self.run_allowed(run).all() for run in self.runs])

    def allowed(self, rows: slice, cols: slice) -> torch.Tensor:
        """[1, len(rows), len(cols)] bool: query rows may attend key cols (segment, validity and rules).
        Evaluated in row chunks so the rule's temporaries stay near ALLOWED_CHUNK elements."""
        row_start, row_stop, _ = rows.indices(self.seq_len)
        col_start, col_stop, _ = cols.indices(self.seq_len)
        cols = slice(col_start, col_stop)
        step = max(1, ALLOWED_CHUNK // max(1, col_stop - col_start))
        if row_stop - row_start <= step:
            return self._allowed(slice(row_start, row_stop), cols)
        out = torch.empty(1, row_stop - row_start, col_stop - col_start, dtype=torch.bool,
                          device=self.valid.device)
        for first in range(row_start, row_stop, step):
            last = min(first + step, row_stop)
            out[:, first - row_start:last - row_start] = self._allowed(slice(first, last), cols)
        return out

    def _allowed(self, rows: slice, cols: slice) -> torch.Tensor:
        def q(t: torch.Tensor) -> torch.Tensor:
            return t[:, rows, None]

        def k(t: torch.Tensor) -> torch.Tensor:
            return t[:, None, cols]

        same_segment = q(self.seg_id) == k(self.seg_id)
        rules = rules_allow(
            self.full_rules, q(self.is_clean), k(self.is_clean), q(self.turn_ids), k(self.turn_ids),
            q(self.block_ids), k(self.block_ids), q(self.type_ids), k(self.type_ids),
        )
        return same_segment & q(self.valid) & k(self.valid) & rules

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """Build a backend's mask/table on first use; later layers get the same object."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "0") not in ("", "0", "false", "False")


def build_spec(batch: PackedBatch, backend: str = "sdpa_dense", strict: bool = False) -> AttentionSpec:
    """Validate a packed batch and build its attention spec. Every host read happens here (cu_seqlens when
    seg_bounds is absent, one read of the checks, one of the plain runs for the segmented family); the layers
    do none. Raises ValueError naming the tensor and values on any violation: bad cu_seqlens, seg_bounds
    that disagree with it, tail positions with token_valid true, metadata of the wrong length, unknown
    backend. `strict` (or env LUMINA_ATTN_STRICT=1): a backend that cannot serve a call raises RuntimeError
    instead of falling back to `segmented`. A window of a pack (`batch.whole` set, sequence parallelism) gets
    the spec of its whole pack."""
    if batch.whole is not None:
        batch = batch.whole
    if backend not in BACKENDS:
        raise ValueError(f"attn backend {backend!r} is not one of {BACKENDS}")
    strict = strict or strict_from_env()
    seq_len = batch.seq_len
    for name in ("type_ids", "turn_ids", "block_ids", "is_clean", "token_valid"):
        t = getattr(batch, name)
        if t.dim() != 2 or t.shape != (1, seq_len):
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [1, S={seq_len}]")
    cu = batch.cu_seqlens
    if batch.seg_bounds is not None:
        bounds = check_bounds(batch.seg_bounds, seq_len, "seg_bounds")
    else:
        bounds = resolve_seg_bounds(cu, seq_len)
        if bounds is None:
            raise ValueError(f"cu_seqlens must hold at least 2 entries (one segment [0, L]), got {cu.tolist()}")
    if cu.dim() != 1 or cu.numel() != len(bounds):
        raise ValueError(f"cu_seqlens has shape {list(cu.shape)} but seg_bounds has {len(bounds)} entries "
                         f"{list(bounds)}")
    device = batch.token_valid.device
    expected = torch.tensor(bounds, dtype=cu.dtype, device=cu.device)
    end = bounds[-1]
    spec = AttentionSpec(
        backend=backend,
        strict=strict,
        bounds=bounds,
        seg_id=segment_ids(expected.to(device), seq_len).unsqueeze(0),
        valid=batch.token_valid,
        type_ids=batch.type_ids,
        turn_ids=batch.turn_ids,
        block_ids=batch.block_ids,
        is_clean=batch.is_clean,
        full_rules=False,
        num_invalid=0,
        runs=group_runs(bounds),
    )
    # One host read for the checks and the rule set; a second (plan backends) for which runs are plain.
    facts = torch.stack([
        (cu != expected).any().long().to(device),
        batch.token_valid[:, end:].any().long(),
        (batch.block_ids >= 0).any().long(),
        (~batch.token_valid).sum(),
    ])
    cu_mismatch, tail_valid, any_block, num_invalid = facts.tolist()
    if cu_mismatch:
        raise ValueError(f"seg_bounds {list(bounds)} disagree with cu_seqlens {cu.tolist()}")
    if tail_valid:
        where = (batch.token_valid[0, end:].nonzero()[:, 0] + end)[:6].tolist()
        raise ValueError(f"token_valid is true at tail positions {where} after cu_seqlens[-1]={end}; "
                         "tail padding must be invalid")
    spec.full_rules, spec.num_invalid = bool(any_block), int(num_invalid)
    if backend in PLAN_BACKENDS:  # no host read is left for the layers
        spec.run_plain = tuple(bool(p) for p in spec.plain_flags().tolist())
    return spec
