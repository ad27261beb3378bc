"""The parallel plan as data: glob patterns over parameter names -> a placement on a named mesh dim.

A rule's pattern (fnmatch; `*` also crosses dots) matches a parameter's name or, for a fused expert tensor,
its split-layout name `...mlp.experts.<e>.<proj>.weight`, so one plan serves both checkpoint layouts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from torch import nn

from lumina.checkpoint.keys import EXPERT_PROJS, is_fused_expert_key, split_expert_key


class PlanError(ValueError):
    """A parallel plan that does not fit the model."""


@dataclass(frozen=True)
class PlanRule:
    """Parameters matching `pattern` are sharded on tensor dim `dim` over mesh dim `mesh_dim`."""

    pattern: str
    dim: int = 0
    mesh_dim: str = "ep"

    @classmethod
    def parse(cls, entry: PlanRule | Mapping | str) -> PlanRule:
        """A rule from a PlanRule, a mapping {pattern, dim, mesh_dim} or a bare pattern (Shard(0) on ep)."""
        if isinstance(entry, PlanRule):
            return entry
        if isinstance(entry, str):
            return cls(entry)
        if isinstance(entry, Mapping):
            unknown = set(entry) - {"pattern", "dim", "mesh_dim"}
            if unknown or "pattern" not in entry:
                raise PlanError(f"plan entry {dict(entry)!r}: expected keys pattern, dim, mesh_dim")
            return cls(str(entry["pattern"]), int(entry.get("dim", 0)), str(entry.get("mesh_dim", "ep")))
        raise PlanError(f"plan entry {entry!r}: expected a pattern string or a mapping")


# The official expert-parallel plan: the three expert projections Shard(0) on ep, fused and split key patterns.
OFFICIAL_PLAN: tuple[PlanRule, ...] = tuple(
    PlanRule(pattern.format(proj))
    for pattern in ("model.layers.*.mlp.experts.{}", "model.layers.*.mlp.experts.*.{}.weight")
    for proj in EXPERT_PROJS)


def parse_plan(entries: Iterable[PlanRule | Mapping | str] | None) -> tuple[PlanRule, ...]:
    """None -> the official plan; otherwise every entry parsed (an empty plan is an error)."""
    if entries is None:
        return OFFICIAL_PLAN
    rules = tuple(PlanRule.parse(e) for e in entries)
    if not rules:
        raise PlanError("the parallel plan is empty: no parameter would be expert-sharded")
    return rules


def _names_of(name: str) -> tuple[str, ...]:
    """A parameter's name in both checkpoint layouts."""
    return (name, split_expert_key(name, 0)) if is_fused_expert_key(name) else (name,)


def expert_parameter_names(model: nn.Module, expert_types: tuple[type, ...]) -> list[str]:
    """Names of the parameters owned by expert modules (the ones a plan must place)."""
    return [f"{module_name}.{pname}" if module_name else pname
            for module_name, module in model.named_modules() if isinstance(module, expert_types)
            for pname, _ in module.named_parameters(recurse=False)]


def resolve_plan(param_names: Sequence[str], rules: Sequence[PlanRule],
                 must_place: Sequence[str] = ()) -> dict[str, PlanRule]:
    """-> {parameter name: its rule}. Raises PlanError naming the offending rules or parameters."""
    if not rules:
        raise PlanError("the parallel plan is empty: no parameter would be expert-sharded")
    placed: dict[str, PlanRule] = {}
    unmatched = []
    for rule in rules:
        hits = [n for n in param_names if any(fnmatchcase(alias, rule.pattern) for alias in _names_of(n))]
        if not hits:
            unmatched.append(rule.pattern)
        for name in hits:
            other = placed.setdefault(name, rule)
            if (other.dim, other.mesh_dim) != (rule.dim, rule.mesh_dim):
                raise PlanError(f"parameter {name} is placed twice: {other} and {rule}")
    if unmatched:
        sample = ", ".join(list(param_names)[:4])
        raise PlanError(f"parallel plan rules match no parameter: {unmatched} (parameter names look like: "
                        f"{sample}, ...)")
    unplaced = [n for n in must_place if n not in placed]
    if unplaced:
        raise PlanError(f"the parallel plan leaves {len(unplaced)} expert tensor(s) unplaced (they would be "
                        f"replicated on every ep rank): {unplaced[:6]}")
    return placed
