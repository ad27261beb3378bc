"""Routed experts with fused parameters (`mlp.experts.{gate,up,down}_proj`, no `.weight` suffix) on a local
expert slice: `gate_proj`/`up_proj` [E_local, I, H], `down_proj` [E_local, H, I]; experts
[expert_offset, expert_offset + E_local) of the layer live here.

Input rows arrive grouped by expert (contiguous slices, sizes `tokens_per_expert`). Two backends compute the
same SwiGLU per slice (`grouped_swiglu`, shared with the expert-parallel `ShardedGroupedExperts`): "grouped_mm"
(`torch._grouped_mm`, one kernel per projection, in one autograd Function with a memory-lean backward) and
"loop" (one matmul per contiguous slice, autograd's own backward). "grouped_mm" falls back to the loop where
the kernel cannot run (dtype/alignment/device)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_GROUPED_MM_DTYPES_CPU = (torch.float32, torch.bfloat16, torch.float16)
CPU_CHUNK_BYTES = 2**20  # largest CPU temporary the grouped SwiGLU builds at once (well under glibc's mmap threshold)


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


def _row_chunks(rows: int, width: int, element_size: int, device: torch.device) -> list[slice]:
    """Row slices of an [rows, width] tensor, each at most CPU_CHUNK_BYTES on CPU (one slice elsewhere)."""
    step = rows if device.type != "cpu" else max(1, CPU_CHUNK_BYTES // (width * element_size))
    return [slice(start, start + step) for start in range(0, rows, max(step, 1))]


def _expert_runs(offsets: torch.Tensor, width: int, element_size: int) -> list[tuple[slice, slice]]:
    """(experts, rows) slices of runs of whole experts whose rows stay within CPU_CHUNK_BYTES of `width`-wide
    rows together (an expert with more rows is a run of its own). offsets: int [E] cumulative row ends."""
    max_rows = max(1, CPU_CHUNK_BYTES // (width * element_size))
    starts = [0, *offsets.tolist()]  # starts[e]: expert e's first row; starts[E]: the row count
    runs, first = [], 0
    for e in range(1, len(starts)):
        if e == len(starts) - 1 or starts[e + 1] - starts[first] > max_rows:
            runs.append((slice(first, e), slice(starts[first], starts[e])))
            first = e
    return runs


class _GroupedSwiGLU(torch.autograd.Function):
    """y = down_e(silu(gate_e x) * up_e x) for the rows of each expert e, as three `torch._grouped_mm` calls.

    Same arithmetic as autograd through the plain composition (output and gradients equal to the bit), but
    with less memory: it saves x, gate x, up x and the hidden product (not silu(gate x) too); the backward writes
    the gradients of gate x and up x into those saved tensors' storage; on CPU the silu/product temporaries
    and the up projection's input gradient are built a chunk at a time (fresh CPU tensors above glibc's mmap
    threshold page-fault on every allocation; chunks reuse heap memory)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,  # noqa: ANN001
                down: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        g = torch._grouped_mm(x, gate.transpose(-2, -1), offs=offsets)  # [N, I]
        u = torch._grouped_mm(x, up.transpose(-2, -1), offs=offsets)
        hidden = torch.empty_like(g)
        for rows in _row_chunks(*g.shape, g.element_size(), g.device):
            torch.mul(F.silu(g[rows]), u[rows], out=hidden[rows])
        ctx.save_for_backward(x, gate, up, down, offsets, g, u, hidden)
        return torch._grouped_mm(hidden, down.transpose(-2, -1), offs=offsets)  # [N, H]

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):  # noqa: ANN001, ANN205
        if getattr(ctx, "consumed", False):
            raise RuntimeError("the grouped SwiGLU experts' backward ran twice on one graph (retain_graph=True): its "
                               "first backward overwrote the saved activations with their gradients")
        ctx.consumed = True
        x, gate, up, down, offsets, g, u, hidden = ctx.saved_tensors
        need_x, need_gate, need_up, need_down, _ = ctx.needs_input_grad
        if grad_y.stride() != (grad_y.shape[1], 1):  # expanded (e.g. from sum()) or empty with odd strides
            grad_y = grad_y.new_empty(grad_y.shape).copy_(grad_y)
        grad_down = torch._grouped_mm(grad_y.t(), hidden, offs=offsets) if need_down else None  # [E, H, I]
        grad_hidden = torch._grouped_mm(grad_y, down, offs=offsets)  # [N, I]
        for rows in _row_chunks(*g.shape, g.element_size(), g.device):
            grad_silu = grad_hidden[rows] * u[rows]
            torch.mul(grad_hidden[rows], F.silu(g[rows]), out=u[rows])  # u now holds d/d(up x)
            torch.ops.aten.silu_backward.grad_input(grad_silu, g[rows], grad_input=g[rows])  # g: d/d(gate x)
        grad_g, grad_u = g, u
        grad_gate = torch._grouped_mm(grad_g.t(), x, offs=offsets) if need_gate else None  # [E, I, H]
        grad_up = torch._grouped_mm(grad_u.t(), x, offs=offsets) if need_up else None
        grad_x = None
        if need_x:
            grad_x = torch._grouped_mm(grad_g, gate, offs=offsets)  # [N, H]
            if x.device.type != "cpu":
                grad_x += torch._grouped_mm(grad_u, up, offs=offsets)
            else:
                for experts, rows in _expert_runs(offsets, x.shape[1], x.element_size()):
                    grad_x[rows] += torch._grouped_mm(grad_u[rows], up[experts], offs=offsets[experts] - rows.start)
        return grad_x, grad_gate, grad_up, grad_down, None


def grouped_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                   tokens_per_expert: torch.Tensor, backend: str = "grouped_mm") -> torch.Tensor:
    """x [N, H] grouped by expert (contiguous runs, sizes tokens_per_expert int [E]); gate/up [E, I, H],
    down [E, H, I] -> [N, H]. "grouped_mm" falls back to "loop" where `torch._grouped_mm` cannot run."""
    if backend == "grouped_mm" and grouped_mm_supported(x, gate) and grouped_mm_supported(x, down):
        offsets = tokens_per_expert.cumsum(0).to(torch.int32)
        return _GroupedSwiGLU.apply(x.contiguous(), gate, up, down, offsets)
    outs = []
    # unbind, not indexing: one stacked weight gradient instead of a full-size one per expert
    weights = zip(gate.unbind(0), up.unbind(0), down.unbind(0), strict=True)
    for rows, (g, u, d) in zip(x.split(tokens_per_expert.tolist(), dim=0), weights, strict=True):
        outs.append(F.linear(F.silu(F.linear(rows, g)) * F.linear(rows, u), d))
    return torch.cat(outs, dim=0) if outs else x.new_zeros(x.shape)


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
        return grouped_swiglu(x, self.gate_proj, self.up_proj, self.down_proj, tokens_per_expert, self.backend)
