"""`AttentionSpec`: everything attention needs about one packed batch, validated and built once per forward
(backends cache their masks in `spec.cache`, so the first layer builds them). With `keys`, segment i of the
queries attends segment i of the keys (a key/value cache); without, the queries are the keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lumina.attention.backend import backend_class
from lumina.attention.bounds import check_bounds, resolve_seg_bounds
from lumina.attention.rules import AUTO, AttentionRule, Rows, resolve_rule
from lumina.attention.runs import Run, group_runs
from lumina.contract.batch import PackedBatch, segment_ids

ALLOWED_CHUNK = 1 << 24  # elements per rule evaluation chunk (bounds the temporaries of `allowed`)


@dataclass(eq=False)
class Side:
    """The queries or the keys of a pack: bounds (cu_seqlens on the host; positions >= bounds[-1] are tail
    padding), seg_id [1, L] (tail = number of segments), valid [1, L], rows: `Rows` of [1, L] tensors."""

    bounds: tuple[int, ...]
    seg_id: torch.Tensor
    valid: torch.Tensor
    rows: Rows

    @property
    def length(self) -> int:
        return self.valid.shape[1]


@dataclass(eq=False)
class AttentionSpec:
    """The queries and keys of one pack plus host facts. num_invalid: query rows with token_valid false.
    runs: adjacent segments of equal (query, key) lengths; run_plain: per run, whether the rule allows every
    pair inside it (see `plain`)."""

    backend: str
    strict: bool
    rule: AttentionRule
    queries: Side
    keys: Side
    num_invalid: int
    runs: tuple[Run, ...] = ()
    run_plain: tuple[bool, ...] | None = None
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def seq_len(self) -> int:
        """Query rows Lq."""
        return self.queries.length

    @property
    def key_len(self) -> int:
        """Key rows Lk (= Lq in self-attention)."""
        return self.keys.length

    @property
    def bounds(self) -> tuple[int, ...]:
        return self.queries.bounds

    def final_rows(self) -> torch.Tensor:
        """[1, Lk] bool: key rows the rule makes final (valid rows only; see `AttentionRule.final_rows`)."""
        keys = self.keys
        final = self.rule.final_rows(Rows(*(t[0] for t in keys.rows)), keys.seg_id[0])
        return (final & keys.valid[0]).unsqueeze(0)

    def run_allowed(self, run: Run) -> torch.Tensor:
        """[m, 1, Lq, Lk] bool rule slices of the run's m segments."""
        return torch.stack([
            self.allowed(slice(qs, qs + run.q_length), slice(ks, ks + run.k_length))
            for qs, ks in zip(range(run.q_start, run.q_start + run.q_size, run.q_length),
                              range(run.k_start, run.k_start + run.k_size, run.k_length), strict=True)])

    def plain(self) -> tuple[bool, ...]:
        """Per run: the rule allows every pair inside it, so no mask is needed (one host read, once)."""
        if self.run_plain is None:
            flags = torch.stack([self.run_allowed(run).all() for run in self.runs])
            self.run_plain = tuple(bool(p) for p in flags.tolist())
        return self.run_plain

    def allowed(self, rows: slice, cols: slice) -> torch.Tensor:
        """[1, len(rows), len(cols)] bool: query rows may attend key cols (segment, validity and rule).
        Evaluated in row chunks so the rule's temporaries stay near ALLOWED_CHUNK elements."""
        row_start, row_stop, _ = rows.indices(self.seq_len)
        col_start, col_stop, _ = cols.indices(self.key_len)
        cols = slice(col_start, col_stop)
        step = max(1, ALLOWED_CHUNK // max(1, col_stop - col_start))
        if row_stop - row_start <= step:
            return self._allowed(slice(row_start, row_stop), cols)
        out = torch.empty(1, row_stop - row_start, col_stop - col_start, dtype=torch.bool,
                          device=self.queries.valid.device)
        for first in range(row_start, row_stop, step):
            last = min(first + step, row_stop)
            out[:, first - row_start:last - row_start] = self._allowed(slice(first, last), cols)
        return out

    def _allowed(self, rows: slice, cols: slice) -> torch.Tensor:
        q, k = self.queries, self.keys
        q_rows = Rows(*(t[:, rows, None] for t in q.rows))
        k_rows = Rows(*(t[:, None, cols] for t in k.rows))
        same_segment = q.seg_id[:, rows, None] == k.seg_id[:, None, cols]
        valid = q.valid[:, rows, None] & k.valid[:, None, cols]
        return same_segment & valid & self.rule.allow(q_rows, k_rows)

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """Build a backend's mask/table on first use; later layers get the same object."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def _side(batch: PackedBatch, who: str) -> Side:
    """Validate one side's shapes and host bounds (`build_spec` reads the device checks)."""
    seq_len = batch.seq_len
    for name in ("type_ids", "turn_ids", "block_ids", "is_clean", "token_valid"):
        t = getattr(batch, name)
        if t.dim() != 2 or t.shape != (1, seq_len):
            raise ValueError(f"{who}{name} has shape {list(t.shape)}, expected [1, S={seq_len}]")
    cu = batch.cu_seqlens
    if batch.seg_bounds is not None:
        bounds = check_bounds(batch.seg_bounds, seq_len, f"{who}seg_bounds")
    else:
        bounds = resolve_seg_bounds(cu, seq_len)
        if bounds is None:
            raise ValueError(f"{who}cu_seqlens must hold at least 2 entries (one segment [0, L]), got {cu.tolist()}")
    if cu.dim() != 1 or cu.numel() != len(bounds):
        raise ValueError(f"{who}cu_seqlens has shape {list(cu.shape)} but {who}seg_bounds has {len(bounds)} "
                         f"entries {list(bounds)}")
    seg_id = segment_ids(torch.tensor(bounds, device=batch.token_valid.device), seq_len).unsqueeze(0)
    rows = Rows(batch.is_clean, batch.turn_ids, batch.block_ids, batch.type_ids)
    return Side(bounds, seg_id, batch.token_valid, rows)


def build_spec(batch: PackedBatch, backend: str = "sdpa_dense", strict: bool = False, rule: str = AUTO,
               keys: PackedBatch | None = None) -> AttentionSpec:
    """Validate a packed batch and build its attention spec; every host read happens here, the layers do none.
    Raises ValueError naming the tensor and values on any violation (bad cu_seqlens, seg_bounds that disagree
    with it, valid tail positions, metadata of the wrong length, unknown backend or rule). `strict` (or env
    LUMINA_ATTN_STRICT=1): a backend that cannot serve a call raises instead of falling back. `rule`: a rule's
    name ("auto": the official choice per pack). `keys`: the key rows when they are not `batch` (same number
    of segments, at least as many rows). A window of a pack (`batch.whole` set) gets its whole pack's spec."""
    if batch.whole is not None:
        batch = batch.whole
    backend_cls = backend_class(backend)
    strict = strict or os.environ.get("LUMINA_ATTN_STRICT", "0") not in ("", "0", "false", "False")
    queries = key_side = _side(batch, "")
    sides = [(batch, queries, "")]
    if keys is not None:
        if keys.whole is not None:
            raise ValueError("keys: a window of a pack (keys.whole set); pass the whole pack's key rows")
        key_side = _side(keys, "keys.")
        sides.append((keys, key_side, "keys."))
        if len(key_side.bounds) != len(queries.bounds):
            raise ValueError(f"keys.seg_bounds {list(key_side.bounds)} hold {len(key_side.bounds) - 1} segments, "
                             f"the queries' {list(queries.bounds)} hold {len(queries.bounds) - 1}")
        if key_side.length < queries.length:
            raise ValueError(f"keys hold {key_side.length} rows, fewer than the {queries.length} query rows")
    device = batch.token_valid.device
    # One host read for the checks and the rule; a second (backends that plan runs) for which runs are plain.
    facts = []
    for pack, side, _ in sides:
        cu = pack.cu_seqlens
        expected = torch.tensor(side.bounds, dtype=cu.dtype, device=cu.device)
        facts += [(cu != expected).any().long().to(device), pack.token_valid[:, side.bounds[-1]:].any().long().to(device),
                  (pack.block_ids >= 0).any().long().to(device)]
    facts.append((~batch.token_valid).sum())
    facts = torch.stack(facts).tolist()
    for i, (pack, side, who) in enumerate(sides):
        end, cu = side.bounds[-1], pack.cu_seqlens
        if facts[3 * i]:
            raise ValueError(f"{who}seg_bounds {list(side.bounds)} disagree with {who}cu_seqlens {cu.tolist()}")
        if facts[3 * i + 1]:
            where = (pack.token_valid[0, end:].nonzero()[:, 0] + end)[:6].tolist()
            raise ValueError(f"{who}token_valid is true at tail positions {where} after {who}cu_seqlens[-1]={end}; "
                             "tail padding must be invalid")
    uses_blocks = any(facts[3 * i + 2] for i in range(len(sides)))
    spec = AttentionSpec(
        backend=backend,
        strict=strict,
        rule=resolve_rule(rule, bool(uses_blocks)),
        queries=queries,
        keys=key_side,
        num_invalid=int(facts[-1]),
        runs=group_runs(queries.bounds, key_side.bounds),
    )
    if backend_cls.plans_runs:
        spec.plain()
    return spec
