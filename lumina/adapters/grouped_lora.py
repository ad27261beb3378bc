"""The routed experts' SwiGLU with a low-rank term on each projection, over expert-sorted rows:
    p(x) = W_e x + s * B_e (A_e x)   for W in (gate, up, down), A_e [r, in], B_e [out, r], s = alpha / r,
run by the grouped GEMM the base experts use (`torch._grouped_mm` with the same run offsets), or one matmul
per expert where it cannot run. No per-expert delta weight B_e A_e is ever formed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lumina.model.experts import grouped_mm_supported


class _GroupedLinear(torch.autograd.Function):
    """rows [N, in] sorted by expert (int32 offsets [E]: run ends), weight [E, out, in] -> [N, out]."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor,  # noqa: ANN001
                offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows, weight, offsets)
        return torch._grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        rows, weight, offsets = ctx.saved_tensors
        grad = grad.contiguous()
        grad_rows = torch._grouped_mm(grad, weight, offs=offsets) if ctx.needs_input_grad[0] else None
        grad_weight = torch._grouped_mm(grad.t(), rows, offs=offsets) if ctx.needs_input_grad[1] else None
        return grad_rows, grad_weight, None


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, tokens_per_expert: torch.Tensor,
                   fused: bool) -> torch.Tensor:
    """rows [N, in] sorted by expert (runs of sizes tokens_per_expert int [E]) -> [N, out]: rows @ weight_e^T
    per run (weight [E, out, in]); `fused`: one grouped GEMM, else a matmul per expert."""
    if fused:
        return _GroupedLinear.apply(rows.contiguous(), weight, tokens_per_expert.cumsum(0).to(torch.int32))
    parts = [F.linear(x, w) for x, w in zip(rows.split(tokens_per_expert.tolist(), dim=0), weight.unbind(0),
                                            strict=True)]
    return torch.cat(parts, dim=0) if parts else rows.new_zeros(rows.shape[0], weight.shape[1])


def lora_swiglu(rows: torch.Tensor, base: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                lora_a: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                lora_b: tuple[torch.Tensor, torch.Tensor, torch.Tensor], scale: float,
                tokens_per_expert: torch.Tensor, backend: str = "grouped_mm") -> torch.Tensor:
    """rows [N, H] sorted by expert -> [N, H]: down'(silu(gate' x) * up' x) per run, each projection p' = p +
    scale * B A with base (gate, up [E, I, H], down [E, H, I]), lora_a ([E, r, H], [E, r, H], [E, r, I]) and
    lora_b ([E, I, r], [E, I, r], [E, H, r]); autograd through the grouped GEMMs."""
    weights = (*base, *lora_a, *lora_b)
    fused = backend == "grouped_mm" and all(grouped_mm_supported(rows, w) for w in weights)

    def project(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        low = grouped_linear(grouped_linear(x, a, tokens_per_expert, fused), b, tokens_per_expert, fused)
        return grouped_linear(x, w, tokens_per_expert, fused) + scale * low

    (gate, up, down), (a_gate, a_up, a_down), (b_gate, b_up, b_down) = base, lora_a, lora_b
    hidden = F.silu(project(rows, gate, a_gate, b_gate)) * project(rows, up, a_up, b_up)
    return project(hidden, down, a_down, b_down)
