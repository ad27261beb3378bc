"""Routed experts with fused parameters (`mlp.experts.{gate,up,down}_proj`, no `.weight` suffix) on a local
expert slice: `gate_proj`/`up_proj` [E_local, I, H], `down_proj` [E_local, H, I]; experts
[expert_offset, expert_offset + E_local) of the layer live here.

Input rows arrive grouped by expert (contiguous slices, sizes `tokens_per_expert`). Two backends compute the
same SwiGLU per slice (`grouped_swiglu`, shared with the expert-parallel `ShardedGroupedExperts`): "grouped_mm"
(`torch._grouped_mm`, one kernel per projection, in one autograd Function with a memory-lean backward) and
"loop" (one matmul per contiguous slice, autograd's own backward). "grouped_mm" falls back to the loop where
the kernel cannot run (dtype/alignment/device).

With `RoutedCopies` (the local dispatcher's fused path) the experts take the T tokens instead of their T*k
copies, gather their own rows and return the weighted sum over each token's k copies (`routed_swiglu`), so
autograd keeps no [T*k, H] tensor: see `_RoutedSwiGLU`."""

from __future__ import annotations

from dataclasses import dataclass

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


def _swiglu_hidden(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) * u for g, u [N, I], built a CPU chunk at a time (no silu(g) copy of full size)."""
    hidden = torch.empty_like(g)
    for rows in _row_chunks(*g.shape, g.element_size(), g.device):
        torch.mul(F.silu(g[rows]), u[rows], out=hidden[rows])
    return hidden


def _swiglu_backward_(grad_hidden: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> None:
    """Given d/d(hidden) [N, I] of hidden = silu(g) * u, overwrite g with d/dg and u with d/du (CPU chunks)."""
    for rows in _row_chunks(*g.shape, g.element_size(), g.device):
        grad_silu = grad_hidden[rows] * u[rows]
        torch.mul(grad_hidden[rows], F.silu(g[rows]), out=u[rows])
        torch.ops.aten.silu_backward.grad_input(grad_silu, g[rows], grad_input=g[rows])


def _refuse_second_backward(ctx: torch.autograd.function.FunctionCtx) -> None:
    if getattr(ctx, "consumed", False):
        raise RuntimeError("the grouped SwiGLU experts' backward ran twice on one graph (retain_graph=True): its "
                           "first backward overwrote the saved activations with their gradients")
    ctx.consumed = True


class _GroupedSwiGLU(torch.autograd.Function):
    """y = down_e(silu(gate_e x) * up_e x) for the rows of each expert e, as three `torch._grouped_mm` calls.

    Same arithmetic as autograd through the plain composition (output and gradients equal to the bit), but
    with less memory: it saves x, gate x and up x only (the hidden product is recomputed elementwise in the
    backward); the backward writes the gradients of gate x and up x into those saved tensors' storage; on CPU
    the silu/product temporaries and the up projection's input gradient are built a chunk at a time (fresh CPU
    tensors above glibc's mmap threshold page-fault on every allocation; chunks reuse heap memory)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,  # noqa: ANN001
                down: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        g = torch._grouped_mm(x, gate.transpose(-2, -1), offs=offsets)  # [N, I]
        u = torch._grouped_mm(x, up.transpose(-2, -1), offs=offsets)
        ctx.save_for_backward(x, gate, up, down, offsets, g, u)
        return torch._grouped_mm(_swiglu_hidden(g, u), down.transpose(-2, -1), offs=offsets)  # [N, H]

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):  # noqa: ANN001, ANN205
        _refuse_second_backward(ctx)
        x, gate, up, down, offsets, g, u = ctx.saved_tensors
        need_x, need_gate, need_up, need_down, _ = ctx.needs_input_grad
        if grad_y.stride() != (grad_y.shape[1], 1):  # expanded (e.g. from sum()) or empty with odd strides
            grad_y = grad_y.new_empty(grad_y.shape).copy_(grad_y)
        grad_down = None
        if need_down:  # [E, H, I]
            grad_down = torch._grouped_mm(grad_y.t(), _swiglu_hidden(g, u), offs=offsets)
        grad_hidden = torch._grouped_mm(grad_y, down, offs=offsets)  # [N, I]
        _swiglu_backward_(grad_hidden, g, u)
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


@dataclass
class RoutedCopies:
    """The T*k routed copies of T tokens, for experts that gather their own rows and weigh their own outputs
    (`GroupedExperts(x, tokens_per_expert, copies)`). order: int64 [T*k], the flat (token, slot) index
    t*k + s of the copy at each expert-grouped row (token order kept inside an expert); weights: fp32 [T, k];
    cpu_chunk_bytes: largest CPU temporary built at once."""

    order: torch.Tensor
    weights: torch.Tensor
    cpu_chunk_bytes: int = CPU_CHUNK_BYTES


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the k copies are weighted and summed in: fp32, or wider when the activations are."""
    return torch.promote_types(dtype, torch.float32)


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """The inverse permutation of order [N]: the row of each flat (token, slot) copy."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def _sum_copies(rows: torch.Tensor, inverse: torch.Tensor, top_k: int,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """rows [T*k, W] in expert-grouped order -> [T, W]: each token's k rows (weighted by weights [T, k] in the
    accumulation dtype, or plainly summed in rows' dtype)."""
    copies = rows.index_select(0, inverse).view(-1, top_k, rows.shape[1])
    if weights is None:
        return copies.sum(dim=1)
    acc = _accumulation_dtype(rows.dtype)
    return torch.bmm(weights.to(acc).unsqueeze(1), copies.to(acc)).squeeze(1)


def _scatter_to_slots(per_row: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """per_row [T*k] in expert-grouped order -> [T, k] in weights' dtype (no scatter-add: order is a permutation)."""
    return per_row.new_empty(per_row.shape).index_copy_(0, order, per_row).view_as(weights).to(weights.dtype)


@dataclass
class _Block:
    """Rows of the expert-grouped order handled together by the blocked path: several whole experts, or one
    piece of an expert larger than a block. parts: (expert, its rows within the block, whether they are the
    expert's first)."""

    rows: slice
    parts: list[tuple[int, slice, bool]]

    @property
    def size(self) -> int:
        return self.rows.stop - self.rows.start


def _split_evenly(count: int, max_rows: int) -> list[slice]:
    """count rows as ceil(count / max_rows) slices of (nearly) equal size: no sliver slice at the end."""
    size = -(-count // -(-count // max_rows))
    return [slice(offset, min(offset + size, count)) for offset in range(0, count, size)]


def _expert_blocks(counts: torch.Tensor, max_rows: int) -> list[_Block]:
    """Blocks of at most max_rows rows: consecutive whole experts packed together, an expert with more rows
    split evenly into blocks of its own. counts: int [E] rows per expert (read to the host)."""
    blocks: list[_Block] = []
    packing = False  # whether the last block takes more whole experts
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count > max_rows:
            blocks += [_Block(slice(start + piece.start, start + piece.stop),
                              [(expert, slice(0, piece.stop - piece.start), piece.start == 0)])
                       for piece in _split_evenly(count, max_rows)]
            packing = False
        elif count and packing and blocks[-1].size + count <= max_rows:
            last = blocks[-1]
            last.parts.append((expert, slice(last.size, last.size + count), True))
            last.rows = slice(last.rows.start, last.rows.stop + count)
        elif count:
            blocks.append(_Block(slice(start, start + count), [(expert, slice(0, count), True)]))
            packing = True
        start += count
    return blocks


def _accumulate(dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """dst = a @ b on an expert's first block, dst += a @ b on its later ones, in dst's dtype."""
    a, b = a.to(dst.dtype), b.to(dst.dtype)
    if first:
        torch.mm(a, b, out=dst)
    else:
        dst.addmm_(a, b)


def _expert_grad(weight: torch.Tensor, blocks: list[_Block], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised `dtype` gradient of weight [E, ...], zero for the experts in no block (no rows)."""
    grad = torch.empty(weight.shape, dtype=dtype, device=weight.device)
    present = {expert for block in blocks for expert, _, _ in block.parts}
    for expert in sorted(set(range(weight.shape[0])) - present):
        grad[expert].zero_()
    return grad


@dataclass
class _Saved:
    """What `_RoutedSwiGLU` keeps for its backward (besides x and the weights, no per-copy H-wide tensor)."""

    x: torch.Tensor  # [T, H], the layer's input (kept by the router and the shared expert anyway)
    weights: torch.Tensor  # fp32 [T, k]
    gate: torch.Tensor  # [E, I, H]
    up: torch.Tensor  # [E, I, H]
    down: torch.Tensor  # [E, H, I]
    order: torch.Tensor  # int64 [T*k]
    g: torch.Tensor  # [T*k, I]: gate x of each copy, overwritten by its gradient in the backward
    u: torch.Tensor  # [T*k, I]: up x of each copy, likewise

    @property
    def top_k(self) -> int:
        return self.weights.shape[1]

    def tokens(self) -> torch.Tensor:
        """int64 [T*k]: the token of each expert-grouped row."""
        return self.order // self.top_k

    def row_weights(self) -> torch.Tensor:
        """fp32 [T*k, 1]: the combine weight of each expert-grouped row."""
        return self.weights.reshape(-1).index_select(0, self.order).unsqueeze(-1)


@dataclass
class _ExpertMatmul:
    """The whole path's products over expert-grouped rows: `torch._grouped_mm` on `offsets` (int32 [E] row
    ends), or, given host row `bounds` (E + 1 starts), one mm per expert (the "loop" backend)."""

    offsets: torch.Tensor
    bounds: list[int] | None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a [N, K] x b [E, K, M] -> [N, M] (each expert's rows times its matrix), or a [K, N] x b [N, M]
        -> [E, K, M] (each expert's rows' product, zero for an empty expert)."""
        if self.bounds is None:
            return torch._grouped_mm(a, b, offs=self.offsets)
        spans = list(zip(self.bounds, self.bounds[1:], strict=False))
        if b.dim() == 3:
            out = a.new_empty(a.shape[0], b.shape[2])
            for expert, (start, stop) in enumerate(spans):
                torch.mm(a[start:stop], b[expert], out=out[start:stop])
            return out
        out = a.new_empty(len(spans), a.shape[0], b.shape[1])
        for expert, (start, stop) in enumerate(spans):
            torch.mm(a[:, start:stop], b[start:stop], out=out[expert])
        return out


def _whole_forward(x: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                   down: torch.Tensor, order: torch.Tensor,
                   matmul: _ExpertMatmul) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole tensors: -> (out [T, H] in the accumulation dtype, g, u [T*k, I])."""
    x_local = x.index_select(0, order // weights.shape[1])  # [T*k, H], dropped before the next projection
    g = matmul(x_local, gate.transpose(-2, -1))  # [T*k, I]
    u = matmul(x_local, up.transpose(-2, -1))
    del x_local
    y_local = matmul(_swiglu_hidden(g, u), down.transpose(-2, -1))  # [T*k, H]
    return _sum_copies(y_local, _inverse(order), weights.shape[1], weights), g, u


def _whole_backward(grad: torch.Tensor, s: _Saved, matmul: _ExpertMatmul,
                    needs: tuple[bool, ...]) -> list[torch.Tensor | None]:
    """Gradients of (x, weights, gate, up, down) from grad [T, H], whole tensors."""
    need_x, need_w, need_gate, need_up, need_down = needs
    grad_x = grad_w = grad_gate = grad_up = grad_down = None
    tokens, row_weight = s.tokens(), s.row_weights()
    upstream = grad.index_select(0, tokens)  # [T*k, H]: each copy's unweighted token gradient
    grad_hidden = matmul(upstream, s.down)  # [T*k, I]: down_e^T g_t
    if need_w or need_down:
        hidden = _swiglu_hidden(s.g, s.u)
        if need_w:  # <g_t, down_e hidden> = <down_e^T g_t, hidden>
            acc = _accumulation_dtype(hidden.dtype)
            grad_w = _scatter_to_slots(torch.linalg.vecdot(grad_hidden.to(acc), hidden.to(acc)), s.order, s.weights)
        if need_down:
            grad_down = matmul(upstream.t(), hidden.mul_(row_weight))  # [E, H, I]
        del hidden
    del upstream
    _swiglu_backward_(grad_hidden.mul_(row_weight), s.g, s.u)
    if need_gate or need_up:
        x_local = s.x.index_select(0, tokens)
        grad_gate = matmul(s.g.t(), x_local) if need_gate else None  # [E, I, H]
        grad_up = matmul(s.u.t(), x_local) if need_up else None
        del x_local
    if need_x:
        grad_local = matmul(s.g, s.gate)  # [T*k, H]
        grad_local += matmul(s.u, s.up)
        grad_x = _sum_copies(grad_local, _inverse(s.order), s.top_k)
    return [grad_x, grad_w, grad_gate, grad_up, grad_down]


def _largest(blocks: list[_Block]) -> int:
    """Rows of the largest block."""
    return max((block.size for block in blocks), default=0)


class _Buffers:
    """Reusable per-block temporaries of the blocked path: [rows, width] tensors handed out as [n, width]."""

    def __init__(self, rows: int, like: torch.Tensor) -> None:
        self.rows, self.like, self.pool = rows, like, {}

    def __call__(self, name: str, n: int, width: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        if name not in self.pool:
            self.pool[name] = self.like.new_empty(self.rows, width, dtype=dtype or self.like.dtype)
        return self.pool[name][:n]


def _blocks_forward(x: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor, order: torch.Tensor,
                    blocks: list[_Block]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block of rows at a time, every temporary a reused block buffer, one mm per expert in the block: ->
    (out [T, H] in the accumulation dtype, g, u [T*k, I]). Copies are added into their token's row."""
    top_k, hidden_size, inter = weights.shape[1], x.shape[1], gate.shape[1]
    acc = _accumulation_dtype(x.dtype)
    g, u = x.new_empty(order.numel(), inter), x.new_empty(order.numel(), inter)
    out = torch.zeros(x.shape[0], hidden_size, dtype=acc, device=x.device)
    row_weight = weights.reshape(-1).index_select(0, order).unsqueeze(-1)  # [T*k, 1]
    token_of_row = order // top_k  # [T*k]
    buf = _Buffers(_largest(blocks), x)
    for block in blocks:
        rows, tokens = block.rows, token_of_row[block.rows]
        x_rows = torch.index_select(x, 0, tokens, out=buf("x", block.size, hidden_size))
        g_rows, u_rows = g[rows], u[rows]
        for expert, part, _ in block.parts:
            torch.mm(x_rows[part], gate[expert].t(), out=g_rows[part])
            torch.mm(x_rows[part], up[expert].t(), out=u_rows[part])
        hidden = torch.ops.aten.silu.out(g_rows, out=buf("hidden", block.size, inter)).mul_(u_rows)
        y_rows = buf("y", block.size, hidden_size)
        for expert, part, _ in block.parts:
            torch.mm(hidden[part], down[expert].t(), out=y_rows[part])
        out.index_add_(0, tokens, y_rows.to(acc).mul_(row_weight[rows]))
    return out, g, u


def _blocks_backward(grad: torch.Tensor, s: _Saved, blocks: list[_Block],
                     needs: tuple[bool, ...]) -> list[torch.Tensor | None]:
    """Gradients of (x, weights, gate, up, down) from grad [T, H], a block of rows at a time: the token
    gradients and inputs gathered into reused buffers, one mm per expert in the block, the weight gradients
    accumulated in place, the input gradients added into their token's row."""
    need_x, need_w, need_gate, need_up, need_down = needs
    hidden_size, inter = s.x.shape[1], s.g.shape[1]
    acc = _accumulation_dtype(s.x.dtype)
    grad_x = torch.zeros(s.x.shape, dtype=acc, device=s.x.device) if need_x else None
    grad_w_rows = s.weights.new_empty(s.order.numel(), dtype=acc) if need_w else None
    grad_gate, grad_up, grad_down = (_expert_grad(w, blocks, acc) if need else None  # summed over blocks in acc
                                     for w, need in ((s.gate, need_gate), (s.up, need_up), (s.down, need_down)))
    row_weight = s.row_weights()
    token_of_row = s.tokens()
    buf = _Buffers(_largest(blocks), s.g)
    for block in blocks:
        rows, n, tokens = block.rows, block.size, token_of_row[block.rows]
        g, u, weight = s.g[rows], s.u[rows], row_weight[rows]
        upstream = torch.index_select(grad, 0, tokens, out=buf("h_wide", n, hidden_size))  # unweighted
        grad_hidden = buf("grad_hidden", n, inter)
        for expert, part, _ in block.parts:
            torch.mm(upstream[part], s.down[expert], out=grad_hidden[part])  # down_e^T g_t
        act = torch.ops.aten.silu.out(g, out=buf("act", n, inter))
        hidden = torch.mul(act, u, out=buf("hidden", n, inter))
        if need_w:
            torch.linalg.vecdot(grad_hidden.to(acc), hidden.to(acc), out=grad_w_rows[rows])
        if need_down:
            hidden.mul_(weight)
            for expert, part, first in block.parts:
                _accumulate(grad_down[expert], upstream[part].t(), hidden[part], first)
        grad_hidden.mul_(weight)
        grad_silu = torch.mul(grad_hidden, u, out=hidden)
        torch.mul(grad_hidden, act, out=u)  # u now holds d/d(up x)
        torch.ops.aten.silu_backward.grad_input(grad_silu, g, grad_input=g)  # g: d/d(gate x)
        if need_gate or need_up:
            x_rows = torch.index_select(s.x, 0, tokens, out=upstream)
            for expert, part, first in block.parts:
                if need_gate:
                    _accumulate(grad_gate[expert], g[part].t(), x_rows[part], first)
                if need_up:
                    _accumulate(grad_up[expert], u[part].t(), x_rows[part], first)
        if need_x:
            grad_rows = upstream
            for expert, part, _ in block.parts:
                torch.mm(g[part], s.gate[expert], out=grad_rows[part]).addmm_(u[part], s.up[expert])
            grad_x.index_add_(0, tokens, grad_rows.to(acc))
    grad_w = _scatter_to_slots(grad_w_rows, s.order, s.weights) if need_w else None
    grad_gate, grad_up, grad_down = (None if grad is None else grad.to(w.dtype)
                                     for grad, w in ((grad_gate, s.gate), (grad_up, s.up), (grad_down, s.down)))
    return [grad_x, grad_w, grad_gate, grad_up, grad_down]


class _RoutedSwiGLU(torch.autograd.Function):
    """x [T, H] tokens -> sum_s w[t, s] * down_e(silu(gate_e x_t) * up_e x_t) [T, H], e = the expert of copy
    (t, s): the local dispatcher's gather, the grouped SwiGLU and its weighted combine as one Function.

    It saves x (the layer keeps it anyway), the weights, the copies' order and gate x, up x [T*k, I]: no
    gathered copies (re-gathered from x in the backward), no hidden product (recomputed elementwise), no expert
    outputs. The routing-weight gradient <g_t, y_{t,s}> is taken as <down_e^T g_t, hidden_{t,s}>, from the
    unweighted down_e^T g_t the backward computes anyway, w applied after. Outputs and gradients equal the
    unfused path to fp32 rounding (weighting and summing in fp32, or wider activations' dtype).

    max_rows = 0: whole tensors, gathered and summed through the inverse permutation (deterministic), the
    products by `torch._grouped_mm` (grouped) or one mm per expert; off CPU, and small CPU problems.
    Otherwise (CPU) blocks of at most max_rows rows (whole experts packed together, larger experts split):
    every temporary a reused block buffer, one mm per expert in a block, each copy's output added into its
    token's row, the weight gradients accumulated in place; no fresh tensor above glibc's mmap threshold but
    gate x and up x, and few small ops per layer. The backward overwrites gate x and up x with their
    gradients: a second backward on one graph raises. Recomputable under non-reentrant checkpointing (the
    saved tensors are deterministic given the routing)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,  # noqa: ANN001
                down: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, max_rows: int,
                grouped: bool) -> torch.Tensor:
        offsets, ctx.blocks, ctx.bounds = None, None, None
        if max_rows == 0:
            offsets = counts.cumsum(0).to(torch.int32)
            ctx.bounds = None if grouped else [0, *offsets.tolist()]
            out, g, u = _whole_forward(x, weights, gate, up, down, order, _ExpertMatmul(offsets, ctx.bounds))
        else:
            ctx.blocks = _expert_blocks(counts, max_rows)
            out, g, u = _blocks_forward(x, weights, gate, up, down, order, ctx.blocks)
        ctx.save_for_backward(x, weights, gate, up, down, order, offsets if grouped else None, g, u)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        _refuse_second_backward(ctx)
        x, weights, gate, up, down, order, offsets, g, u = ctx.saved_tensors
        saved = _Saved(x, weights, gate, up, down, order, g, u)
        needs = tuple(ctx.needs_input_grad[:5])
        if ctx.blocks is None:
            grads = _whole_backward(grad, saved, _ExpertMatmul(offsets, ctx.bounds), needs)
        else:
            grads = _blocks_backward(grad, saved, ctx.blocks, needs)
        if grads[0] is not None:
            grads[0] = grads[0].to(x.dtype)
        return (*grads, None, None, None, None)


def _routed_max_rows(x: torch.Tensor, copies: RoutedCopies) -> int:
    """`_RoutedSwiGLU`'s max_rows: 0 (whole tensors) off CPU, and on CPU while a [T*k, H] (at least fp32)
    temporary fits `copies.cpu_chunk_bytes`; else blocks of as many H-wide rows as fit it."""
    row_bytes = x.shape[1] * max(x.element_size(), 4)
    if x.device.type != "cpu" or copies.order.numel() * row_bytes <= copies.cpu_chunk_bytes:
        return 0
    return max(1, copies.cpu_chunk_bytes // row_bytes)


def routed_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                  tokens_per_expert: torch.Tensor, copies: RoutedCopies, backend: str = "grouped_mm") -> torch.Tensor:
    """x [T, H] tokens; gate/up [E, I, H], down [E, H, I]; copies.order [T*k] grouped by expert (runs of sizes
    tokens_per_expert int [E]) -> sum_s w[t, s] * expert_{e(t, s)}(x[t]) [T, H] in x's dtype, weighted and
    summed in fp32. The same function as gather -> `grouped_swiglu` -> weighted combine, keeping no [T*k, H]
    tensor for the backward (`_RoutedSwiGLU`)."""
    grouped = backend == "grouped_mm" and grouped_mm_supported(x, gate) and grouped_mm_supported(x, down)
    return _RoutedSwiGLU.apply(x, copies.weights, gate, up, down, copies.order, tokens_per_expert,
                               _routed_max_rows(x, copies), grouped)


def check_tokens_per_expert(tokens_per_expert: torch.Tensor, num_local_experts: int) -> None:
    if tokens_per_expert.shape != (num_local_experts,):
        raise ValueError(f"tokens_per_expert has shape {list(tokens_per_expert.shape)}, expected "
                         f"[{num_local_experts}] (the local experts)")


def swiglu_experts(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                   tokens_per_expert: torch.Tensor, backend: str, copies: RoutedCopies | None) -> torch.Tensor:
    """`grouped_swiglu` on x [N, H] grouped by expert, or, with `copies`, `routed_swiglu` on x [T, H] tokens."""
    if copies is None:
        return grouped_swiglu(x, gate, up, down, tokens_per_expert, backend)
    return routed_swiglu(x, gate, up, down, tokens_per_expert, copies, backend)


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

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor,
                copies: RoutedCopies | None = None) -> torch.Tensor:
        """x [N, H] grouped by local expert; tokens_per_expert int [E_local] summing to N -> [N, H]. With
        `copies`: x [T, H] tokens, tokens_per_expert counting their T*k copies -> the weighted sum [T, H]."""
        check_tokens_per_expert(tokens_per_expert, self.num_local_experts)
        return swiglu_experts(x, self.gate_proj, self.up_proj, self.down_proj, tokens_per_expert, self.backend,
                              copies)
