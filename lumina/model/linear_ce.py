"""Fused linear + cross-entropy in row chunks: the loss of a head without its full logits.

    total = sum_i row_weight[i] * ce[i]     (fp32 scalar, differentiable w.r.t. x, weight, bias)
    ce    = -log softmax(x W^T + b)[target] (fp32 [N], detached)
    preds = argmax of the logits            (int64 [N], detached)

The forward walks the rows `chunk_rows` at a time through one reused [chunk, V] fp32 buffer: logits, CE,
argmax, then (softmax - onehot) * row_weight in place, this chunk's share of the gradients of x, weight and
bias. Backward only scales them by the gradient of `total`: the same three GEMMs as autograd through full
logits, with nothing of size [N, V]. Logits are formed in the head's compute dtype (autocast's where it is on,
else the inputs') and upcast; weight and bias gradients accumulate in fp32 and return in their input's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

# fp32 logits per chunk (one buffer per call). Every chunk re-reads the weight and updates its fp32 gradient, so
# small chunks are slow on CPU (V = 157184, H = 256: 3.2x full-logits autograd at 8 MiB, about 1x from 128 MiB).
CHUNK_BYTES = 256 * 2**20


class HeadLoss(NamedTuple):
    """total: fp32 scalar sum of row_weight * ce; per_row: fp32 CE [N] (or [N, C]); preds: int64 argmax."""

    total: torch.Tensor
    per_row: torch.Tensor
    preds: torch.Tensor


def auto_chunk_rows(num_classes: int) -> int:
    """Rows whose fp32 logits fit CHUNK_BYTES (at least one)."""
    return max(1, CHUNK_BYTES // (4 * num_classes))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # noqa: ANN001
                targets: torch.Tensor, row_weight: torch.Tensor, chunk_rows: int,
                dtype: torch.dtype):  # noqa: ANN205
        """Runs with autocast off; `dtype` is the head's compute dtype."""
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        num_rows, num_classes = x.shape[0], weight.shape[0]
        x_dtype, w_dtype, b_dtype = x.dtype, weight.dtype, None if bias is None else bias.dtype
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
        ce = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        preds = torch.empty(num_rows, dtype=torch.long, device=x.device)
        grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_x else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if need_w else None
        grad_b = torch.zeros(num_classes, dtype=torch.float32, device=x.device) if need_b else None
        step = max(1, min(chunk_rows, num_rows))
        buffer = torch.empty(step, num_classes, dtype=torch.float32, device=x.device) if num_rows else None
        fp32 = dtype == torch.float32
        for start in range(0, num_rows, step):
            stop = min(start + step, num_rows)
            rows, target = x[start:stop], targets[start:stop]
            logits = buffer[:stop - start]
            if fp32:
                torch.matmul(rows, weight.t(), out=logits)
                if bias is not None:
                    logits.add_(bias)
            else:
                logits.copy_(F.linear(rows, weight, bias))
            torch.argmax(logits, dim=1, out=preds[start:stop])
            lse = torch.logsumexp(logits, dim=1)
            torch.sub(lse, logits.gather(1, target.unsqueeze(1)).squeeze(1), out=ce[start:stop])
            # d(row_weight * ce) / d logits = (softmax - onehot) * row_weight, built in the logits buffer
            probs = logits.sub_(lse.unsqueeze(1)).exp_()
            probs.scatter_add_(1, target.unsqueeze(1), probs.new_full((stop - start, 1), -1.0))
            probs.mul_(row_weight[start:stop].unsqueeze(1))
            grad_logits = probs if fp32 else probs.to(weight.dtype)
            if need_x:
                torch.matmul(grad_logits, weight, out=grad_x[start:stop])
            if need_w:
                if fp32:
                    grad_w.addmm_(grad_logits.t(), rows)
                else:
                    grad_w.add_(grad_logits.t() @ rows)
            if need_b:
                grad_b.add_(probs.sum(0))
        total = torch.dot(ce, row_weight.float())
        ctx.grads = (None if grad_x is None else grad_x.to(x_dtype), None if grad_w is None else grad_w.to(w_dtype),
                     None if grad_b is None else grad_b.to(b_dtype))
        ctx.mark_non_differentiable(ce, preds)
        return total, ce, preds

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor, grad_ce: object, grad_preds: object):  # noqa: ANN001, ANN205
        if ctx.grads is None:
            raise RuntimeError("linear_cross_entropy: a second backward through the same graph; its gradients "
                               "were computed in the forward and handed out in the first backward")
        grads, ctx.grads = ctx.grads, None
        scaled = tuple(None if g is None else g.mul_(grad_total.to(g.dtype)) for g in grads)
        return (*scaled, None, None, None, None)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, row_weight: torch.Tensor, chunk_rows: int = 0) -> HeadLoss:
    """x [N, H], weight [V, H], bias [V] or None, targets int64 [N] in [0, V), row_weight [N];
    chunk_rows 0 = `auto_chunk_rows(V)`. Returns HeadLoss(total, ce [N], preds [N])."""
    if x.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: x has shape {list(x.shape)}, weight {list(weight.shape)}")
    if targets.shape != x.shape[:1] or row_weight.shape != x.shape[:1]:
        raise ValueError(f"linear_cross_entropy: targets {list(targets.shape)} and row_weight "
                         f"{list(row_weight.shape)} must both be [{x.shape[0]}]")
    if chunk_rows < 0:
        raise ValueError(f"linear_cross_entropy: chunk_rows={chunk_rows} must be >= 0 (0 = auto)")
    chunk = chunk_rows or auto_chunk_rows(weight.shape[0])
    device_type = x.device.type
    dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
             else torch.promote_types(x.dtype, weight.dtype))
    with torch.autocast(device_type, enabled=False):
        return HeadLoss(*_LinearCrossEntropy.apply(x, weight, bias, targets.long(), row_weight.float(), chunk, dtype))
