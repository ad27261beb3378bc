"""LoRA (`adapter=lora`): a rank-r update scale * B A (scale = alpha / r) beside each targeted projection, B
zero at the start so the adapted model equals its base. Targets are shell-style globs over module names:
  nn.Linear (attention `query_key_value`, `dense`, the dense MLPs and the shared expert) -> `LoRALinear`,
      A `lora_A.weight` [r, in], B `lora_B.weight` [out, r] (PEFT's names);
  the routed experts (`GroupedExperts`) -> `LoRAGroupedExperts`, per-expert stacked factors
      `lora_A.<proj>` [E, r, in], `lora_B.<proj>` [E, out, r] for proj in gate_proj, up_proj, down_proj.
The adapted modules replace the originals in their parents but hold the very same base parameters under the
same names, so every base state-dict key is unchanged. The router is never a target."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from lumina.adapters.base import ADAPTERS, Adapter
from lumina.adapters.grouped_lora import lora_swiglu
from lumina.model.experts import GroupedExperts, RoutedCopies, combine_copies, inverse_permutation
from lumina.model.routers import MoERouter

DEFAULT_TARGETS = ("*.attention.query_key_value", "*.attention.dense", "*.mlp.*_proj", "*.mlp.experts")
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class LoRALinear(nn.Linear):
    """A Linear y = x W^T (+ b) + scale * B A dropout(x); `weight` and `bias` are the base Linear's own
    parameters, `lora_A` [r, in] (Kaiming-uniform, as PEFT) and `lora_B` [out, r] (zero) the adapter's."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self._base = (base,)  # the original module (not registered), put back by `merge_adapter`
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **factory)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **factory)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora()

    @property
    def base(self) -> nn.Linear:
        """The Linear this one adapts (sharing its parameters)."""
        return self._base[0]

    def reset_parameters(self) -> None:
        """The base Linear's own init (its weight and bias are these), then `reset_lora`."""
        self.base.reset_parameters()
        self.reset_lora()

    def reset_lora(self) -> None:
        """A Kaiming-uniform (a = sqrt(5), PEFT's default), B zero."""
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def delta_weight(self) -> torch.Tensor:
        """scale * B A [out, in] in fp32."""
        return self.scale * (self.lora_B.weight.float() @ self.lora_A.weight.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        low_rank = self.lora_B(self.lora_A(self.lora_dropout(x)))
        return F.linear(x, self.weight, self.bias) + self.scale * low_rank


class LoRAGroupedExperts(GroupedExperts):
    """Routed experts with per-expert low-rank factors beside each stacked projection: `lora_A.<proj>`
    [E, r, in] (each expert's A Kaiming-uniform), `lora_B.<proj>` [E, out, r] (zero); run by `lora_swiglu`.
    gate_proj, up_proj and down_proj are the base experts' own parameters."""

    def __init__(self, base: GroupedExperts, rank: int, alpha: float) -> None:
        nn.Module.__init__(self)
        self.num_local_experts, self.backend, self.std = base.num_local_experts, base.backend, base.std
        self.gate_proj, self.up_proj, self.down_proj = base.gate_proj, base.up_proj, base.down_proj
        self._base = (base,)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        for name in EXPERT_PROJS:
            weight = _local(getattr(self, name))
            experts, out_dim, in_dim = weight.shape
            factory = dict(device=weight.device, dtype=weight.dtype)
            self.lora_A[name] = nn.Parameter(torch.empty(experts, rank, in_dim, **factory))
            self.lora_B[name] = nn.Parameter(torch.empty(experts, out_dim, rank, **factory))
        self.reset_lora()

    @property
    def base(self) -> GroupedExperts:
        return self._base[0]

    def reset_parameters(self) -> None:
        """The base experts' own init (N(0, std)), then `reset_lora`."""
        super().reset_parameters()
        self.reset_lora()

    def reset_lora(self) -> None:
        """Each expert's A Kaiming-uniform (a = sqrt(5)), B zero."""
        with torch.no_grad():
            for name in EXPERT_PROJS:
                for a in self.lora_A[name].unbind(0):
                    nn.init.kaiming_uniform_(a, a=math.sqrt(5))
                self.lora_B[name].zero_()

    def delta_weights(self) -> dict[str, torch.Tensor]:
        """proj -> scale * B_e A_e [E, out, in] in fp32 (for merging; the forward never forms it)."""
        return {name: self.scale * torch.bmm(self.lora_B[name].float(), self.lora_A[name].float())
                for name in EXPERT_PROJS}

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                copies: RoutedCopies | None = None) -> torch.Tensor:
        """As `GroupedExperts.forward`: x [N, H] sorted by local expert -> [N, H]; with `copies`, x [T, H]
        tokens -> their weighted sum of expert outputs [T, H]."""
        if tokens_per_expert.shape != (self.num_local_experts,):
            raise ValueError(f"tokens_per_expert has shape {list(tokens_per_expert.shape)}, expected "
                             f"[{self.num_local_experts}] (the local experts)")
        lora_a = tuple(_local(self.lora_A[name]) for name in EXPERT_PROJS)
        lora_b = tuple(_local(self.lora_B[name]) for name in EXPERT_PROJS)
        rows = x if copies is None else x.index_select(0, copies.order // copies.weights.shape[1])
        y = lora_swiglu(rows, self.projections(), lora_a, lora_b, self.scale, tokens_per_expert, self.backend)
        if copies is None:
            return y
        return combine_copies(y, copies.weights, copies.order, inverse_permutation(copies.order))


def lora_modules(model: nn.Module) -> dict[str, LoRALinear | LoRAGroupedExperts]:
    """Every module of `model` LoRA adapted, by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear | LoRAGroupedExperts)}


def lora_parameter_names(model: nn.Module) -> list[str]:
    """The names of the LoRA factors of `model` (`lora_A` / `lora_B` of each adapted module)."""
    return [f"{name}.{param}" for name, module in lora_modules(model).items()
            for param, _ in module.named_parameters() if param.startswith("lora_")]


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` at dotted `name` in `model`."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


@ADAPTERS.register("lora")
class LoRA(Adapter):
    """rank r >= 1, alpha > 0 (scale alpha / r), dropout in [0, 1) on Linear targets only (refused with expert
    targets, as PEFT does), targets: globs over module names (`DEFAULT_TARGETS`: attention, dense MLPs, shared
    and routed experts)."""

    freezes_base: ClassVar[bool] = True

    def __init__(self, rank: int = 16, alpha: float = 32.0, dropout: float = 0.0,
                 targets: Sequence[str] = DEFAULT_TARGETS) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"adapter.rank={rank!r}: must be an integer >= 1")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ValueError(f"adapter.alpha={alpha!r}: must be a number > 0")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"adapter.dropout={dropout!r}: must be in [0, 1)")
        if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"adapter.targets={targets!r}: must be a non-empty list of module-name globs")
        self.rank, self.alpha, self.dropout, self.targets = rank, float(alpha), float(dropout), list(targets)

    def target_names(self, model: nn.Module) -> list[str]:
        """The names of the modules the targets select, in model order; ValueError for a glob matching no
        module, or a module that is not a Linear or the routed experts (the router among them)."""
        modules = dict(model.named_modules())
        chosen: set[str] = set()
        for glob in self.targets:
            hits = [name for name in modules if name and fnmatchcase(name, glob)]
            if not hits:
                raise ValueError(f"adapter.targets: {glob!r} matches no module (names look like "
                                 f"'model.layers.0.attention.dense')")
            chosen.update(hits)
        ordered = [name for name in modules if name in chosen]
        for name in ordered:
            module = modules[name]
            if isinstance(module, MoERouter) or not isinstance(module, nn.Linear | GroupedExperts):
                raise ValueError(f"adapter.targets selects {name!r}, a {type(module).__name__}: LoRA adapts "
                                 "Linear layers and the routed experts only (the router stays frozen)")
            if isinstance(module, LoRALinear | LoRAGroupedExperts):
                raise ValueError(f"adapter.targets selects {name!r}, which already has a LoRA adapter")
            if isinstance(module, GroupedExperts) and self.dropout > 0:
                raise ValueError(f"adapter.dropout={self.dropout}: dropout is refused on the routed experts "
                                 f"({name!r}); set it to 0 or leave the experts out of adapter.targets")
        return ordered

    def apply(self, model: nn.Module) -> list[str]:
        """Adapt the targeted modules in place; return the names of the LoRA parameters added."""
        for name in self.target_names(model):
            module = model.get_submodule(name)
            if isinstance(module, GroupedExperts):
                adapted: nn.Module = LoRAGroupedExperts(module, self.rank, self.alpha)
            else:
                adapted = LoRALinear(module, self.rank, self.alpha, self.dropout)
            replace_module(model, name, adapted)
        return lora_parameter_names(model)
