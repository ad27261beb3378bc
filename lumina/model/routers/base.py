"""The MoE router's contract (`MoERouter`), its output (`Routing`) and the registry of routers by name
(`ROUTERS`; `LuminaConfig.score_function` names one, "sigmoid" is the released model's). A router is
`mlp.gate` of an MoE layer; everything the rest of lumina needs from it is a method of `MoERouter`. A new
router is one module in this package registering its class with `@ROUTERS.register("name")`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lumina.model.config import LuminaConfig
from lumina.parts import Registry

ROUTERS = Registry("router", "lumina.model.routers")


@dataclass
class Routing:
    """One MoE layer's routing of T tokens."""

    logits: torch.Tensor  # fp32 [T, E], the router's raw scores
    topk_ids: torch.Tensor  # int64 [T, k]
    topk_weights: torch.Tensor  # fp32 [T, k], the combine weights


class PackRows(NamedTuple):
    """Where the routed tokens sit in their pack: rows `start` .. start + T of a pack of `total` rows (a
    sequence-parallel rank routes a window of the pack). Selection noise is one [total, E] draw per pack."""

    start: int
    total: int


class _Fp32Logits(torch.autograd.Function):
    """(x [T, H], weight [E, H]) -> F.linear(x.float(), weight.float()) [T, E] with autograd's gradients to the
    bit, saving x and weight in their own dtypes (no fp32 copy of bf16 activations)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(x, weight)
        with torch.autocast(x.device.type, enabled=False):  # fp32 under autocast too (bf16-mixed)
            return F.linear(x.float(), weight.float())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        grad_x = grad.mm(weight.float()).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = grad.t().mm(x.float()).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


class MoERouter(nn.Module):
    """Base of every router: a linear gate `weight` [E, H] giving fp32 logits (init `LuminaConfig.router_init`),
    the selection noise, and the methods a router must define (`selection_bias` when it has one)."""

    # persistent [E] buffer name (checkpoint key `mlp.gate.<name>`) -> the dtype it keeps whatever the model's
    BUFFER_DTYPES: ClassVar[dict[str, torch.dtype]] = {}

    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.init_kind = config.router_init
        self.init_std = config.initializer_range
        self.selection_noise = 0.0
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def reset_parameters(self) -> None:
        if self.init_kind == "normal":
            nn.init.normal_(self.weight, mean=0.0, std=self.init_std)
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module signature
        super()._apply(fn, recurse)
        for name, dtype in self.BUFFER_DTYPES.items():  # a model-wide .to(bf16) must not round them
            buffer = getattr(self, name)
            if buffer.dtype != dtype:
                setattr(self, name, buffer.to(dtype))
        return self

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] (any dtype) -> fp32 logits [T, E] (fp32 under autocast too)."""
        return _Fp32Logits.apply(x, self.weight)

    def set_selection_noise(self, std: float) -> None:
        """Std of the Gaussian noise added in training mode to the scores the router selects on (noisy top-k
        gating, Shazeer et al. 2017); 0 = off. Evaluation never adds it; the combine weights never see it."""
        if not std >= 0:
            raise ValueError(f"{type(self).__name__}.set_selection_noise: std={std!r} must be >= 0")
        self.selection_noise = float(std)

    def add_selection_noise(self, scores: torch.Tensor, pack: PackRows | None) -> torch.Tensor:
        """scores [T, E] (no grad) plus the training-mode noise: rows pack.start .. + T of one standard-normal
        [pack.total, E] draw (a fresh [T, E] draw without `pack`), times `selection_noise`."""
        if not self.training or self.selection_noise <= 0:
            return scores
        if pack is None:
            noise = torch.randn_like(scores)
        else:
            start, total = pack
            if not 0 <= start <= total - scores.shape[0]:
                raise ValueError(f"{type(self).__name__}: pack rows {tuple(pack)} do not hold {scores.shape[0]} "
                                 "routed rows")
            noise = torch.randn(total, scores.shape[1], dtype=scores.dtype, device=scores.device)
            noise = noise[start:start + scores.shape[0]]
        return scores + self.selection_noise * noise

    def forward(self, x: torch.Tensor, pack: PackRows | None = None) -> Routing:
        """x [T, H] -> Routing of the T tokens; `pack` places them in their pack (for the selection noise)."""
        raise NotImplementedError

    def weigh(self, logits: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """logits fp32 [T, E], ids [T, k] -> combine weights fp32 [T, k], bit for bit what `forward` gives at
        those ids (activation checkpointing recomputes the weights of replayed ids with it)."""
        raise NotImplementedError

    def balance_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., E] -> fp32 per-token expert probabilities [..., E] (rows sum to 1): the P of the
        load-balance loss under `objective.balance.p_source: router`."""
        raise NotImplementedError

    def selection_bias(self) -> torch.Tensor | None:
        """The [E] selection bias the sign-rule update moves in place, or None when this router has none."""
        return None
