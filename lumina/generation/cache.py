"""The samplers' forward: hidden states at chosen rows of a pack, either by the whole backbone over the whole
pack at every step (`cache=false`, the reference) or through a `KVCache` of the rows the attention rule makes
final (`cache=true`, exact: a final row's keys and values never change while decoding). One `SamplerForward`
per batch of prompts; each segment (a prompt, or one guidance branch of it) is named and keeps its own cache.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

import torch
from torch import nn

from lumina.attention import KVCache
from lumina.contract.batch import PackedBatch

log = logging.getLogger(__name__)
_WARNED: set[str] = set()
GIB = 1 << 30


def cache_bytes_per_row(model: nn.Module) -> int:
    """Bytes one row's keys and values take over every layer, in the model's dtype."""
    cfg = model.config
    itemsize = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


class SamplerForward:
    """`forward(pack, rows, names)` -> hidden [N, H] at flat `rows` of `pack` (B = 1, one segment per name,
    no tail). `enabled`: through the cache; `budget_gib`: what `reserve` lets the caches of one batch hold."""

    def __init__(self, model: nn.Module, enabled: bool, budget_gib: float) -> None:
        self.model, self.enabled, self.budget_gib = model, enabled, budget_gib
        self.cache = KVCache() if enabled else None
        self.peak_bytes = 0

    def reserve(self, rows: Sequence[tuple[Hashable, int]]) -> None:
        """rows: (prompt name, most rows its segments may cache) per prompt. Refuses, naming the prompt and
        `cache_budget_gib`, the first prompt whose cache would take the batch's caches over the budget."""
        if not self.enabled:
            return
        per_row, total = cache_bytes_per_row(self.model), 0
        for name, count in rows:
            total += count * per_row
            if total > self.budget_gib * GIB:
                raise ValueError(f"prompt {name!r}: its key/value cache ({count} rows x {per_row} bytes) takes this "
                                 f"batch's caches to {total / GIB:.3g} GiB, over cache_budget_gib={self.budget_gib}; "
                                 "raise cache_budget_gib, lower batch_size or set cache=false")

    def __call__(self, pack: PackedBatch, rows: torch.Tensor, names: Sequence[Hashable]) -> torch.Tensor:
        if self.cache is None:
            return self.model.backbone(pack)[0, rows]
        step = self.cache.step(pack, names)
        hidden = self.model.backbone(step.queries, step)[0]  # [Nq, H]
        where = torch.full((pack.seq_len,), -1, dtype=torch.long, device=rows.device)
        where[step.rows] = torch.arange(step.rows.numel(), device=rows.device)
        index = where[rows]
        if bool((index < 0).any()):
            raise ValueError("SamplerForward: asked for hidden states of rows the cache holds (final rows are "
                             "not recomputed)")
        self.peak_bytes = max(self.peak_bytes, self.cache.nbytes())
        self._warn_if_recomputed(step)
        return hidden[index]

    def _warn_if_recomputed(self, step) -> None:  # noqa: ANN001 - a CachedStep
        """Once per rule: clean rows the rule does not make final are computed again at every step."""
        rule = self.model.config.attn_rule
        if rule in _WARNED:
            return
        kept = torch.zeros(step.rows.numel(), dtype=torch.bool, device=step.rows.device)
        for rows in step.kept:
            if rows is not None:
                kept[rows] = True
        recomputed = int((step.queries.is_clean[0] & ~kept).sum())
        if recomputed:
            _WARNED.add(rule)
            log.warning("attn_rule=%s does not make %d clean rows final: the key/value cache cannot hold them, so "
                        "they run the full forward at every step (logged once)", rule, recomputed)

    def close(self, what: str) -> None:
        """Log the cache's peak size (one line per batch)."""
        if self.cache is not None:
            dtype = next(self.model.parameters()).dtype
            log.info("%s: key/value cache peak %.4f GiB (%s), %d rows held at the end", what,
                     self.peak_bytes / GIB, dtype, self.cache.num_rows())
