"""Match checkpoint tensors (split, fused or a mix) to the fused state-dict keys a model expects.

Every expected key gets one source: `Whole` (one checkpoint tensor) or `Stacked` (the split tensors of
experts 0..E-1, stacked on dim 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lumina.checkpoint.keys import is_fused_expert_key, parse_split_expert_key, split_expert_key
from lumina.checkpoint.reader import TensorInfo


@dataclass(frozen=True)
class Whole:
    """The model tensor is stored as checkpoint tensor `key`."""

    key: str
    info: TensorInfo


@dataclass(frozen=True)
class Stacked:
    """The model's fused [E, ...] expert tensor is stored as E split tensors; `keys[e]` holds slice e."""

    keys: tuple[str, ...]
    infos: tuple[TensorInfo, ...]


Source = Whole | Stacked


class CheckpointMismatchError(ValueError):
    """The checkpoint's keys/shapes disagree with the model. Every problem is listed by key name."""

    def __init__(self, where: str, missing: list[str], unexpected: list[str], mis_shaped: list[str],
                 conflicting: list[str]) -> None:
        self.missing, self.unexpected = missing, unexpected
        self.mis_shaped, self.conflicting = mis_shaped, conflicting
        sections = [(title, items) for title, items in (("missing", missing), ("unexpected", unexpected),
                                                        ("mis-shaped", mis_shaped), ("conflicting", conflicting))
                    if items]
        count = sum(len(items) for _, items in sections)
        lines = [f"{where}: checkpoint does not match the model ({count} problems)"]
        for title, items in sections:
            lines.append(f"  {title} ({len(items)}):")
            lines += [f"    {item}" for item in items]
        super().__init__("\n".join(lines))


def match_checkpoint(tensors: Mapping[str, TensorInfo], expected: Mapping[str, tuple[int, ...]],
                     where: str) -> dict[str, Source]:
    """Source of every key of `expected` (fused-layout names -> shapes), in `expected`'s order. Raises one
    CheckpointMismatchError listing every missing, unexpected, mis-shaped and conflicting key (an expert
    tensor stored both fused and split, or split in mixed dtypes), before any weight is read."""
    wholes: dict[str, TensorInfo] = {}
    slices: dict[str, dict[int, str]] = {}
    unexpected: list[str] = []
    for key, info in tensors.items():
        parsed = parse_split_expert_key(key)
        if parsed is not None and parsed[0] in expected:
            fused, expert = parsed
            if expert >= expected[fused][0]:
                unexpected.append(f"{key} (expert index {expert} >= num_experts={expected[fused][0]})")
            else:
                slices.setdefault(fused, {})[expert] = key
        elif key in expected:
            wholes[key] = info
        else:
            unexpected.append(key)

    sources: dict[str, Source] = {}
    missing: list[str] = []
    mis_shaped: list[str] = []
    conflicting: list[str] = []
    for name, shape in expected.items():
        parts = slices.get(name)
        if name in wholes and parts:
            conflicting.append(f"{name} is stored fused and also as {len(parts)} split experts "
                               f"(e.g. {parts[min(parts)]})")
        elif name in wholes:
            if wholes[name].shape != tuple(shape):
                mis_shaped.append(f"{name}: checkpoint {list(wholes[name].shape)}, expected {list(shape)}")
            else:
                sources[name] = Whole(name, wholes[name])
        elif parts:
            lacking = [split_expert_key(name, e) for e in range(shape[0]) if e not in parts]
            missing += lacking
            bad = [f"{parts[e]}: checkpoint {list(tensors[parts[e]].shape)}, expected {list(shape[1:])}"
                   for e in sorted(parts) if tensors[parts[e]].shape != tuple(shape[1:])]
            mis_shaped += bad
            dtypes = sorted({str(tensors[k].dtype) for k in parts.values()})
            if len(dtypes) > 1:
                conflicting.append(f"split experts of {name} mix dtypes {dtypes}")
            if not lacking and not bad and len(dtypes) == 1:
                keys = tuple(parts[e] for e in range(shape[0]))
                sources[name] = Stacked(keys, tuple(tensors[k] for k in keys))
        elif is_fused_expert_key(name):
            missing.append(f"{name} (nor its split form {split_expert_key(name, 0)} .. "
                           f"{split_expert_key(name, shape[0] - 1)})")
        else:
            missing.append(name)
    if missing or unexpected or mis_shaped or conflicting:
        raise CheckpointMismatchError(where, missing, unexpected, mis_shaped, conflicting)
    return sources
