"""`apply_compile`: `torch.compile` each decoder layer and the channel head of a built `LuminaModel`, in place
(per block, as torchtitan's `apply_compile`): the modules keep their state-dict keys and their hooks (FSDP2's
unshard, the participation tracker) run outside the compiled code, because only `forward` (and the FFN and
channel-blocks seams that checkpointing calls) is replaced.

Graph breaks that remain, each where a pack's host facts decide the work:
- the attention core (`lumina.attention.attend`, sequence parallelism's all-to-all around it): per-segment
  calls planned from the spec's bounds;
- the routed experts (`MoE.run_experts`, local or expert-parallel): per-expert counts decide the GEMM groups
  and the all-to-all splits;
- under activation checkpointing, the routers' record / replay of their top-k (`Checkpointer`'s hook state)
  and the checkpointed call itself.
Between them the compiler fuses the norms, RoPE, the SwiGLU gates, the routers' scoring and top-k, the
channel head's LayerNorm / adaLN / GELU. The channel head's row count varies from pack to pack and is
compiled dynamic from the first call; the decoder layers see [B, S, H] (S fixed by the data config)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def _dynamic_rows(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`fn` compiled with dim 0 of every tensor argument (the image rows) dynamic from the first call."""
    compiled = torch.compile(fn)

    def run(*args: torch.Tensor) -> torch.Tensor:
        for arg in args:
            torch._dynamo.decorators.mark_unbacked(arg, 0)
        return compiled(*args)
    return run


def apply_compile(model: nn.Module) -> None:
    """Compile `model`'s decoder layers (their `forward`, and `ffn`, the sub-block selective checkpointing
    runs) and its channel head's blocks (`MultiCodebookHead.run`). Apply after `apply_checkpointing`, before
    a sharding strategy wraps the layers; idempotent."""
    if getattr(model, "compiled", False):
        return
    # A checkpointed recompute must run the graphs its forward ran; dynamo's most-recently-used reordering of a
    # frame's cache entries can pick another one whose guards also pass (pytorch/pytorch#166926).
    torch._C._dynamo.eval_frame._set_lru_cache(False)
    for layer in model.model.layers:
        layer.forward = torch.compile(layer.forward)
        layer.ffn = torch.compile(layer.ffn)
    head = model.multi_codebook_head
    head.run = _dynamic_rows(head.run)
    model.compiled = True


def compiled_graphs() -> int:
    """Graphs `torch.compile` has compiled in this process so far (each compile and each recompile adds one)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
