"""The MoE router (`mlp.gate`): fp32 sigmoid scores, group-limited top-k selection on the bias-corrected
scores, weights from the unbiased scores (official `LLaDA2MoeGate`).

In training mode a router may also add Gaussian noise of std `selection_noise` to the biased scores it selects
on (noisy top-k gating, Shazeer et al. 2017; set by the objective from `balance.selection_noise`, 0 = off).
Tokens with identical inputs get identical scores, and a token-independent expert bias can only move all of
them at once; the noise spreads them over the experts whose biased scores lie within about its std. The
weights stay the unbiased, noise-free scores, and evaluation (`eval()`) selects without noise. The noise of a
pack is one [pack rows, E] draw whatever rows this router sees (`pack_rows`, set by the model per forward from
the batch): a window of the pack (sequence parallelism) keeps its own rows of it, so the routing does not
depend on how a pack is split over ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lumina.model.config import LuminaConfig


@dataclass
class Routing:
    """One MoE layer's routing of T tokens: `logits` fp32 [T, E] (pre-sigmoid), `topk_ids` int64 [T, k],
    `topk_weights` fp32 [T, k] (unbiased scores, normalised over the k when k > 1, times
    routed_scaling_factor)."""

    logits: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


class _Fp32Logits(torch.autograd.Function):
    """(x [T, H], weight [E, H]) -> fp32 logits x.float() @ weight.float()^T [T, E], with autograd's gradients of
    F.linear(x.float(), weight.float()) to the bit, saving x and weight in their own dtypes (no fp32 copy of
    bf16 activations; the casts are redone in the backward)."""

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


class _SelectedScores(torch.autograd.Function):
    """(logits [T, E], scores = sigmoid(logits) [T, E] without grad, ids [T, k]) -> scores.gather(1, ids) [T, k]
    with autograd's gradient of sigmoid(logits).gather(1, ids) to the bit (zero off the selected entries),
    saving the k selected scores and ids instead of the [T, E] scores."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        chosen = scores.gather(1, ids)
        ctx.save_for_backward(chosen, ids)
        ctx.num_experts = logits.shape[1]
        return chosen

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        chosen, ids = ctx.saved_tensors
        grad_logits = grad.new_zeros(grad.shape[0], ctx.num_experts)
        grad_logits.scatter_(1, ids, torch.ops.aten.sigmoid_backward(grad, chosen))
        return grad_logits, None, None


class Router(nn.Module):
    def __init__(self, config: LuminaConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.init_kind = config.router_init
        self.init_std = config.initializer_range
        self.selection_noise = 0.0  # std of the training-mode selection noise; set from outside (the objective)
        self.pack_rows: tuple[int, int] | None = None  # (first row, rows of the pack) of the tokens routed next
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        # used for selection only; updated from outside (no released code updates it); always fp32
        self.register_buffer("expert_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        self.reset_parameters()

    def _pack_noise(self, biased: torch.Tensor) -> torch.Tensor:
        """Standard normal noise for biased [T, E]: rows pack_rows[0] .. + T of one draw for the whole pack."""
        if self.pack_rows is None:
            return torch.randn_like(biased)
        start, total = self.pack_rows
        if not 0 <= start <= total - biased.shape[0]:
            raise ValueError(f"Router.pack_rows={self.pack_rows} does not hold {biased.shape[0]} routed rows")
        noise = torch.randn(total, biased.shape[1], dtype=biased.dtype, device=biased.device)
        return noise[start:start + biased.shape[0]]

    def reset_parameters(self) -> None:
        if self.init_kind == "normal":
            nn.init.normal_(self.weight, mean=0.0, std=self.init_std)
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        with torch.no_grad():
            self.expert_bias.zero_()

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module signature
        super()._apply(fn, recurse)
        if self.expert_bias.dtype != torch.float32:  # a model-wide .to(bf16) must not round the bias
            self.expert_bias = self.expert_bias.float()
        return self

    def select(self, biased: torch.Tensor) -> torch.Tensor:
        """Group-limited top-k on biased scores [T, E] -> expert ids [T, k] (descending biased score)."""
        tokens = biased.shape[0]
        grouped = biased.view(tokens, self.n_group, self.num_experts // self.n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep.unsqueeze(-1).expand_as(grouped).reshape(tokens, self.num_experts)
        return biased.masked_fill(~keep, float("-inf")).topk(self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor) -> Routing:
        """x [T, H] (any dtype; the router runs in fp32). Its autograd keeps x, the ids and the k selected scores
        (selection builds no graph)."""
        logits = _Fp32Logits.apply(x, self.weight)  # [T, E]
        with torch.no_grad():
            scores = logits.sigmoid()
            biased = scores + self.expert_bias.float()
            if self.training and self.selection_noise > 0:
                biased = biased + self.selection_noise * self._pack_noise(biased)
            topk_ids = self.select(biased)
        chosen = _SelectedScores.apply(logits, scores, topk_ids)
        return Routing(logits=logits, topk_ids=topk_ids, topk_weights=self.normalise(chosen))

    def weigh(self, scores: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """Unbiased sigmoid scores [T, E] at the selected ids [T, k] -> combine weights fp32 [T, k] (`normalise`)."""
        return self.normalise(scores.gather(1, topk_ids))

    def normalise(self, chosen: torch.Tensor) -> torch.Tensor:
        """Selected scores [T, k] -> combine weights fp32 [T, k]: normalised over the k (skipped for k = 1, as in
        the official gate), times routed_scaling_factor."""
        if self.top_k > 1:
            chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20)
        return chosen * self.routed_scaling_factor
