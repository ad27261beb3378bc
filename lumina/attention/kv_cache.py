"""`KVCache`: the keys and values, per decoder layer, of the rows an attention rule makes final
(`AttentionRule.final_rows`), so that a sampler's next forward computes only the other rows.

    cache = KVCache()
    step = cache.step(pack, names)  # pack: the whole sequences as the full forward sees them, one segment each
    hidden = model.backbone(step.queries, step)  # [1, Nq, H] at the rows the cache does not hold (step.rows)

A segment is named by the caller (e.g. a prompt and its guidance branch) and keeps its rows from call to call;
a segment not named in a call is dropped. Its query rows attend [held rows, query rows] through the spec's
`keys` (one key segment per query segment), so every backend serves it. After the spec is built, the query rows
the rule reports final are appended, at every layer, from the keys and values this forward computes: each row
is written once, by the forward that sees it as final (for a committed text block: the first step of the next
block, where it is clean). Held rows must keep their ids and metadata; a change raises.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from lumina.contract.batch import PackedBatch

HELD_FIELDS = ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean")


@dataclass(eq=False)
class Held:
    """One segment's cached rows: positions [n] in its segment, their row fields ([n] or [n, C]) and, per
    layer, keys / values [1, nkv, n, hd] in the same order."""

    positions: torch.Tensor
    fields: dict[str, torch.Tensor]
    extent: int  # max(positions) + 1: the segment must keep at least this many rows
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.positions.numel()


class KVCache:
    """The held rows of named segments. `nbytes`: what their keys and values occupy (model dtype)."""

    def __init__(self) -> None:
        self.held: dict[Hashable, Held] = {}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for h in self.held.values() for t in (*h.keys, *h.values))

    def num_rows(self) -> int:
        return sum(h.size for h in self.held.values())

    def step(self, pack: PackedBatch, names: Sequence[Hashable]) -> CachedStep:
        """One forward over `pack` (B = 1, segment i named names[i], no tail rows): the rows not held."""
        bounds = pack.seg_bounds
        if bounds is None or len(bounds) - 1 != len(names) or bounds[-1] != pack.seq_len:
            raise ValueError(f"KVCache.step: a pack of {pack.seq_len} rows with seg_bounds {bounds} for "
                             f"{len(names)} segment names; expected one segment per name and no tail rows")
        if len(set(names)) != len(names):
            raise ValueError(f"KVCache.step: segment names {list(names)} repeat")
        self.held = {name: self.held[name] for name in names if name in self.held}
        return CachedStep(self, pack, list(names))


class CachedStep:
    """One forward with a cache: `queries` (the rows not held, in segment order; flat rows `rows` of the pack),
    `keys` (per segment: held rows, then its query rows). `LuminaModel.backbone(queries, step)` calls
    `begin(spec)` once and `layer(i)(k, v)` in each decoder layer, in layer order."""

    def __init__(self, cache: KVCache, pack: PackedBatch, names: list[Hashable]) -> None:
        self.cache, self.names = cache, names
        device = pack.input_ids.device
        self.pack_bounds = pack.seg_bounds
        row_fields = {name: getattr(pack, name)[0] for name in HELD_FIELDS}
        self.held = [cache.held.get(name) for name in names]  # what the keys read (None: nothing yet)
        query_rows, key_fields, checks = [], {name: [] for name in HELD_FIELDS}, []
        self.q_bounds, self.k_bounds = [0], [0]
        for name, held, start, end in zip(names, self.held, self.pack_bounds, self.pack_bounds[1:], strict=False):
            free = torch.ones(end - start, dtype=torch.bool, device=device)
            if held is not None:
                if held.extent > end - start:
                    raise ValueError(f"KVCache: segment {name!r} holds row {held.extent - 1}, but the pack gives it "
                                     f"{end - start} rows")
                free[held.positions] = False
                checks += [(held.fields[f] != row_fields[f][start + held.positions]).any() for f in HELD_FIELDS]
            rows = free.nonzero().squeeze(1) + start
            if rows.numel() == 0:
                raise ValueError(f"KVCache: segment {name!r} has no row left to compute")
            query_rows.append(rows)
            for f in HELD_FIELDS:
                key_fields[f] += ([held.fields[f]] if held is not None else []) + [row_fields[f][rows]]
            self.q_bounds.append(self.q_bounds[-1] + rows.numel())
            self.k_bounds.append(self.k_bounds[-1] + rows.numel() + (held.size if held is not None else 0))
        if checks and bool(torch.stack(checks).any()):
            raise ValueError("KVCache: a held row's ids or metadata changed since it was cached (held rows are "
                             "final and never change); start a new KVCache")
        self.rows = torch.cat(query_rows)  # [Nq] flat rows of the pack
        self.queries = _pack({f: t[self.rows] for f, t in row_fields.items()}, self.q_bounds)
        self.keys = _pack({f: torch.cat(parts) for f, parts in key_fields.items()}, self.k_bounds)
        self.kept: list[torch.Tensor | None] = [None] * len(names)  # per segment: query rows to append

    def begin(self, spec) -> None:  # noqa: ANN001 - the AttentionSpec of (queries, keys)
        """Read the rule's final rows off `spec`; append the final query rows' ids and metadata to the held
        rows (their keys and values follow in `layer`)."""
        final = spec.final_rows()[0].cpu()
        for i, (name, held) in enumerate(zip(self.names, self.held, strict=True)):
            size = 0 if held is None else held.size
            first, last = self.k_bounds[i], self.k_bounds[i + 1]
            if not bool(final[first:first + size].all()):
                raise ValueError(f"KVCache: attention rule {type(spec.rule).__name__} no longer reports every "
                                 f"held row of segment {name!r} final")
            fresh = final[first + size:last].nonzero().squeeze(1)
            if fresh.numel() == 0:
                continue
            q_rows = (fresh + self.q_bounds[i]).to(self.rows.device)
            self.kept[i] = q_rows
            positions = self.rows[q_rows] - self.pack_bounds[i]
            fields = {f: getattr(self.queries, f)[0][q_rows] for f in HELD_FIELDS}
            extent = int(positions.max()) + 1
            if held is None:
                self.cache.held[name] = Held(positions, fields, extent)
            else:
                held.extent = max(held.extent, extent)
                held.positions = torch.cat([held.positions, positions])
                held.fields = {f: torch.cat([held.fields[f], fields[f]]) for f in HELD_FIELDS}

    def layer(self, index: int) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Layer `index`'s hook: k, v [1, nkv, Nq, hd] of the query rows -> keys, values [1, nkv, Lk, hd] of
        the key rows; the final query rows' k and v are appended to the cache (after the keys are read)."""

        def extend(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = []
            for t, which in ((k, "keys"), (v, "values")):
                parts = []
                for i, held in enumerate(self.held):
                    if held is not None:
                        parts.append(getattr(held, which)[index])
                    parts.append(t[:, :, self.q_bounds[i]:self.q_bounds[i + 1]])
                out.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2))
                for name, rows in zip(self.names, self.kept, strict=True):
                    if rows is None:
                        continue
                    stored = getattr(self.cache.held[name], which)
                    fresh = t.index_select(2, rows)
                    if len(stored) == index:
                        stored.append(fresh)
                    else:
                        stored[index] = torch.cat([stored[index], fresh], dim=2)
            return out[0], out[1]

        return extend


def _pack(fields: dict[str, torch.Tensor], bounds: list[int]) -> PackedBatch:
    """Row fields [L] / [L, C] and segment bounds -> a PackedBatch of L valid rows."""
    length = bounds[-1]
    ids = fields["input_ids"]
    return PackedBatch(
        input_ids=ids.unsqueeze(0), type_ids=fields["type_ids"][None], turn_ids=fields["turn_ids"][None],
        block_ids=fields["block_ids"][None], position_ids=fields["position_ids"][None],
        is_clean=fields["is_clean"][None], token_valid=torch.ones(1, length, dtype=torch.bool, device=ids.device),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=ids.device), seg_bounds=tuple(bounds))
