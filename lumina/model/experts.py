"""Routed experts with fused parameters (`mlp.experts.{gate,up,down}_proj`, no `.weight` suffix) on a local
expert slice: `gate_proj`/`up_proj` [E_local, I, H], `down_proj` [E_local, H, I]; experts
[expert_offset, expert_offset + E_local) of the layer live here.

Input rows arrive grouped by expert (contiguous slices, sizes `tokens_per_expert`). Two backends compute the
same SwiGLU per slice: "grouped_mm" (`torch._grouped_mm`, one kernel per projection) and "loop" (one matmul per
contiguous slice). "grouped_mm" falls back to the loop where the kernel cannot run (dtype/alignment/device)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_GROUPED_MM_DTYPES_CPU = (torch.float32, torch.bfloat16, torch.float16)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (`_grouped_mm`'s backward rejects
    broadcast/expanded gradients)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        if grad.dim() == 2 and grad.stride() != (grad.shape[1], 1):  # also empty/expanded ones
            return grad.new_empty(grad.shape).copy_(grad)
        return grad.contiguous()


def grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `torch._grouped_mm(x [N, K], weight^T)` runs here: dtype, device and 16-byte row alignment."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != weight.dtype:
        return False
    if x.device.type == "cpu":
        ok_dtype = x.dtype in _GROUPED_MM_DTYPES_CPU
    elif x.device.type == "cuda":
        ok_dtype = x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9
    else:
        ok_dtype = False
    size = x.element_size()
    return ok_dtype and all(d * size % 16 == 0 for d in weight.shape[1:])


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x [N, in] grouped by expert; weight [E, out, in]; offsets int32 [E] (cumulative ends) -> [N, out]."""
    out = torch._grouped_mm(x.contiguous(), weight.transpose(-2, -1), offs=offsets)
    return _ContiguousGrad.apply(out)


class GroupedExperts(nn.Module):
    def __init__(self, num_local_experts: int, hidden_size: int, intermediate_size: int, backend: str = "grouped_mm",
                 expert_offset: int = 0, std: float = 0.02) -> None:
        super().__init__()
        if backend not in ("grouped_mm", "loop"):
            raise ValueError(f"GroupedExperts.backend={backend!r}: must be 'grouped_mm' or 'loop'")
        self.num_local_experts = num_local_experts
        self.expert_offset = expert_offset
        self.backend = backend
        self.std = std
        self.gate_proj = nn.Parameter(torch.empty(num_local_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_local_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_local_experts, hidden_size, intermediate_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(weight, mean=0.0, std=self.std)

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """x [N, H] grouped by local expert; tokens_per_expert int [E_local] summing to N -> [N, H]."""
        if tokens_per_expert.shape != (self.num_local_experts,):
            raise ValueError(f"tokens_per_expert has shape {list(tokens_per_expert.shape)}, expected "
                             f"[{self.num_local_experts}] (the local experts)")
        if self.backend == "grouped_mm" and grouped_mm_supported(x, self.gate_proj) \
                and grouped_mm_supported(x, self.down_proj):
            offsets = tokens_per_expert.cumsum(0).to(torch.int32)
            hidden = F.silu(grouped_linear(x, self.gate_proj, offsets)) * grouped_linear(x, self.up_proj, offsets)
            return grouped_linear(hidden, self.down_proj, offsets)
        return self._loop(x, tokens_per_expert)

    def _loop(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        outs = []
        # unbind, not indexing: one stacked weight gradient instead of a full-size one per expert
        weights = zip(self.gate_proj.unbind(0), self.up_proj.unbind(0), self.down_proj.unbind(0), strict=True)
        for rows, (gate, up, down) in zip(x.split(tokens_per_expert.tolist(), dim=0), weights, strict=True):
            outs.append(F.linear(F.silu(F.linear(rows, gate)) * F.linear(rows, up), down))
        return torch.cat(outs, dim=0) if outs else x.new_zeros(x.shape)
