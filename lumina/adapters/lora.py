"""LoRA (`adapter=lora`): a rank-r update scale * B A (scale = alpha / r) beside each targeted projection, B
zero at the start so the adapted model equals its base. Targets are shell-style globs over module names:
  nn.Linear (attention `query_key_value`, `dense`, the dense MLPs and the shared expert) -> `LoRALinear`,
      A `lora_A.weight` [r, in], B `lora_B.weight` [out, r] (PEFT's names; each a `LoRAFactor`);
  the routed experts (`GroupedExperts`) -> `LoRAGroupedExperts`, per-expert stacked factors
      `lora_A.<proj>` [E, r, in], `lora_B.<proj>` [E, out, r] for proj in gate_proj, up_proj, down_proj.
The adapted modules replace the originals in their parents but hold the very same base parameters under the
same names, so every base state-dict key is unchanged. The router is never a target.
`modules_to_save` (PEFT's name): globs over module names of base modules trained whole beside the adapter (the
text head and the word embeddings, say); the export writes them with the factors, the rest of the base stays
frozen.

A is drawn from a generator of its own, seeded by the adapter's `seed` and the module's name: the same adapter
under any device, sharding or materialisation order, and the global random stream (the base's init) is not
touched. On the meta device nothing is drawn; `reset_parameters` draws it once the tensors exist."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
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


def init_seed(seed: int, name: str) -> int:
    """The seed of module `name`'s factors under adapter seed `seed`."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def init_lora_a(a: torch.Tensor, seed: int) -> None:
    """a [..., r, in] <- U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with a = sqrt(5), PEFT's default), drawn
    on the CPU from a generator seeded `seed`; a tensor on the meta device is left as it is."""
    if a.is_meta:
        return
    bound = 1.0 / math.sqrt(a.shape[-1])
    drawn = torch.empty(a.shape, dtype=torch.float32).uniform_(-bound, bound,
                                                               generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        a.copy_(drawn)


class LoRAFactor(nn.Module):
    """One low-rank factor, `weight` [out, in], applied as x @ weight^T. It has no `reset_parameters`: the
    adapted module it belongs to initialises it."""

    def __init__(self, in_features: int, out_features: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class LoRALinear(nn.Linear):
    """A Linear y = x W^T (+ b) + scale * B A dropout(x); `weight` and `bias` are the base Linear's own
    parameters, `lora_A` [r, in] (Kaiming-uniform, as PEFT, seeded `seed`) and `lora_B` [out, r] (zero) the
    adapter's. With `active` False it runs the base Linear alone (`LoRA.base_view`)."""

    active: bool = True

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0, seed: int = 0) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self._base = (base,)  # the original module (not registered), put back by `merge_adapter`
        self.rank, self.alpha, self.scale, self.seed = rank, alpha, alpha / rank, seed
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = LoRAFactor(self.in_features, rank, **factory)
        self.lora_B = LoRAFactor(rank, self.out_features, **factory)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora()

    @property
    def base(self) -> nn.Linear:
        """The Linear this one adapts, holding this module's weight and bias (the live ones: materialising or
        sharding replaces the parameter objects)."""
        base = self._base[0]
        base.weight = self.weight
        base.register_parameter("bias", self.bias)
        return base

    def reset_parameters(self) -> None:
        """The base Linear's own init (its weight and bias are these), then `reset_lora`."""
        self.base.reset_parameters()
        self.reset_lora()

    def reset_lora(self) -> None:
        """A Kaiming-uniform (a = sqrt(5), PEFT's default) from `seed`, B zero."""
        init_lora_a(self.lora_A.weight, self.seed)
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        if not self.active:
            return F.linear(x, self.weight, self.bias)
        low_rank = self.lora_B(self.lora_A(self.lora_dropout(x)))
        return F.linear(x, self.weight, self.bias) + self.scale * low_rank


class LoRAGroupedExperts(GroupedExperts):
    """Routed experts with per-expert low-rank factors beside each stacked projection: `lora_A.<proj>`
    [E, r, in] (each expert's A Kaiming-uniform, seeded `seed`), `lora_B.<proj>` [E, out, r] (zero); run by
    `lora_swiglu`. gate_proj, up_proj and down_proj are the base experts' own parameters. Every factor is
    stacked over the experts like the projection it adapts (`stacked_factors`): expert parallelism splits it
    along E with them. With `active` False it runs the base experts alone (`LoRA.base_view`)."""

    active: bool = True

    def __init__(self, base: GroupedExperts, rank: int, alpha: float, seed: int = 0) -> None:
        nn.Module.__init__(self)
        self.num_local_experts, self.backend, self.std = base.num_local_experts, base.backend, base.std
        self.gate_proj, self.up_proj, self.down_proj = base.gate_proj, base.up_proj, base.down_proj
        self._base = (base,)
        self.rank, self.alpha, self.scale, self.seed = rank, alpha, alpha / rank, seed
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
        """The experts this module adapts, holding its live projections."""
        base = self._base[0]
        for name in EXPERT_PROJS:
            setattr(base, name, getattr(self, name))
        base.num_local_experts = self.num_local_experts
        return base

    def stacked_factors(self) -> dict[str, nn.Parameter]:
        """Every factor by its name in this module (`lora_A.gate_proj`, ...): [E, ...], expert e's at row e."""
        return {f"{which}.{proj}": getattr(self, which)[proj] for which in ("lora_A", "lora_B")
                for proj in EXPERT_PROJS}

    def reset_parameters(self) -> None:
        """The base experts' own init (N(0, std)), then `reset_lora`."""
        super().reset_parameters()
        self.reset_lora()

    def reset_lora(self) -> None:
        """Each expert's A Kaiming-uniform (a = sqrt(5)) from `seed` (one draw per projection over all E
        experts), B zero."""
        with torch.no_grad():
            for name in EXPERT_PROJS:
                init_lora_a(self.lora_A[name], init_seed(self.seed, name))
                self.lora_B[name].zero_()

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                copies: RoutedCopies | None = None) -> torch.Tensor:
        """As `GroupedExperts.forward`: x [N, H] sorted by local expert -> [N, H]; with `copies`, x [T, H]
        tokens -> their weighted sum of expert outputs [T, H]."""
        if tokens_per_expert.shape != (self.num_local_experts,):
            raise ValueError(f"tokens_per_expert has shape {list(tokens_per_expert.shape)}, expected "
                             f"[{self.num_local_experts}] (the local experts)")
        if not self.active:
            return super().forward(x, tokens_per_expert, copies)
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


def factor_keys(name: str, module: LoRALinear | LoRAGroupedExperts) -> dict[str, tuple[str, str]]:
    """State-dict key of each base weight adapted module `name` holds -> the keys of its (A, B) factors:
    A [r, in] / B [out, r], or A [E, r, in] / B [E, out, r] for the routed experts."""
    if isinstance(module, LoRALinear):
        return {f"{name}.weight": (f"{name}.lora_A.weight", f"{name}.lora_B.weight")}
    return {f"{name}.{proj}": (f"{name}.lora_A.{proj}", f"{name}.lora_B.{proj}") for proj in EXPERT_PROJS}


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
    and routed experts), seed: an integer >= 0 from which each module's A is drawn (`init_seed`),
    modules_to_save: globs over module names of base modules trained whole (none by default; `saved_modules`)."""

    freezes_base: ClassVar[bool] = True

    def __init__(self, rank: int = 16, alpha: float = 32.0, dropout: float = 0.0,
                 targets: Sequence[str] = DEFAULT_TARGETS, seed: int = 0,
                 modules_to_save: Sequence[str] = ()) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"adapter.rank={rank!r}: must be an integer >= 1")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ValueError(f"adapter.alpha={alpha!r}: must be a number > 0")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"adapter.dropout={dropout!r}: must be in [0, 1)")
        if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"adapter.targets={targets!r}: must be a non-empty list of module-name globs")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"adapter.seed={seed!r}: must be an integer >= 0")
        if isinstance(modules_to_save, str) or not all(isinstance(m, str) and m for m in modules_to_save):
            raise ValueError(f"adapter.modules_to_save={modules_to_save!r}: must be a list of module-name globs")
        self.rank, self.alpha, self.dropout, self.targets = rank, float(alpha), float(dropout), list(targets)
        self.seed, self.modules_to_save = seed, list(modules_to_save)

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
            if isinstance(module, nn.Linear) and type(module).forward is not nn.Linear.forward:
                raise ValueError(f"adapter.targets selects {name!r}, a {type(module).__name__} with a forward of "
                                 "its own (a head's fused loss reads its weight directly): LoRA adapts plain "
                                 "Linear layers")
            if isinstance(module, GroupedExperts) and self.dropout > 0:
                raise ValueError(f"adapter.dropout={self.dropout}: dropout is refused on the routed experts "
                                 f"({name!r}); set it to 0 or leave the experts out of adapter.targets")
        return ordered

    def apply(self, model: nn.Module) -> list[str]:
        """Adapt the targeted modules in place; return the names of the LoRA parameters added."""
        for name in self.target_names(model):
            module = model.get_submodule(name)
            seed = init_seed(self.seed, name)
            if isinstance(module, GroupedExperts):
                adapted: nn.Module = LoRAGroupedExperts(module, self.rank, self.alpha, seed)
            else:
                adapted = LoRALinear(module, self.rank, self.alpha, self.dropout, seed)
            replace_module(model, name, adapted)
        return lora_parameter_names(model)

    def base_view(self, model: nn.Module) -> AbstractContextManager[nn.Module] | None:
        """Every adapted module's base alone, the model in eval mode (`Adapter.base_view`); None with
        `modules_to_save` (those base modules train)."""
        return None if self.modules_to_save else _adapters_off(model)

    def saved_modules(self, model: nn.Module) -> list[str]:
        """The modules `modules_to_save` selects in the adapted `model`, outermost only, in model order;
        ValueError for a glob matching no module, a module with no parameters, one holding the routed experts
        (the split layout has no whole module for them) or one LoRA adapts, holds or is part of."""
        modules = dict(model.named_modules())
        adapted = list(lora_modules(model))
        chosen: set[str] = set()
        for glob in self.modules_to_save:
            hits = [name for name in modules if name and fnmatchcase(name, glob)]
            if not hits:
                raise ValueError(f"adapter.modules_to_save: {glob!r} matches no module (names look like "
                                 "'lm_head', 'model.word_embeddings')")
            chosen.update(hits)
        outermost = [name for name in modules if name in chosen
                     and not any(name.startswith(f"{other}.") for other in chosen)]
        for name in outermost:
            module = modules[name]
            if not any(True for _ in module.parameters()):
                raise ValueError(f"adapter.modules_to_save selects {name!r}, a {type(module).__name__} with no "
                                 "parameters")
            if any(isinstance(m, GroupedExperts) for m in module.modules()):
                raise ValueError(f"adapter.modules_to_save selects {name!r}, which holds routed experts: train "
                                 "them with LoRA (adapter.targets) instead")
            overlap = [a for a in adapted if a == name or a.startswith(f"{name}.") or name.startswith(f"{a}.")]
            if overlap:
                raise ValueError(f"adapter.modules_to_save selects {name!r}, and LoRA adapts {overlap[0]!r} "
                                 "(adapter.targets): a module is adapted or trained whole, not both")
        return outermost


@contextmanager
def _adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """`model` with every LoRA module running its base alone and every module in eval mode; both restored."""
    modes = [(m, m.training) for m in model.modules()]
    adapted = list(lora_modules(model).values())
    model.eval()
    for m in adapted:
        m.active = False
    try:
        yield model
    finally:
        for m in adapted:
            m.active = True
        for m, training in modes:
            m.training = training
