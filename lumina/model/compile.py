"""`apply_compile`: `torch.compile` each decoder layer and the channel head of a built `LuminaModel`, in place
(per block, as torchtitan's `apply_compile`): only methods are replaced on the instances (`forward`, and the
FFN and channel-blocks seams that checkpointing wraps), so the modules keep their state-dict keys and their
hooks (FSDP2's unshard, the participation tracker) run outside the compiled code. The graph breaks that
remain (attention core, routed experts, the checkpointing router replay) and why: experiments/compile.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lumina.model.activation_checkpointing import Checkpointed

COMPILED = "_lumina_compiled"  # marks a function `apply_compile` made


def _dynamic_rows(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`fn` compiled with dim 0 of every argument (the image rows) dynamic from the first call, 0 and 1 included."""
    compiled = torch.compile(fn)

    def run(*args: torch.Tensor) -> torch.Tensor:
        for arg in args:
            torch._dynamo.decorators.mark_unbacked(arg, 0)
        return compiled(*args)
    return run


def _compile_method(module: nn.Module, name: str, dynamic_rows: bool = False) -> None:
    """Replace `module.<name>` on the instance by its compiled form (a `Checkpointed` one: its inner function)."""
    method: Any = getattr(module, name)
    owner, attr = (method, "fn") if isinstance(method, Checkpointed) else (module, name)
    fn = getattr(owner, attr)
    if getattr(fn, COMPILED, False):
        return
    compiled = _dynamic_rows(fn) if dynamic_rows else torch.compile(fn)
    setattr(compiled, COMPILED, True)
    setattr(owner, attr, compiled)


def apply_compile(model: nn.Module) -> None:
    """Compile `model`'s decoder layers (`forward`, `ffn`) and its image head's `run`, in place (idempotent).
    Apply after `apply_checkpointing` (which drops the compiled forms) and before a sharding strategy wraps
    the layers."""
    # a recompute must run its forward's graphs, not another cache entry whose guards pass (pytorch#166926)
    torch._C._dynamo.eval_frame._set_lru_cache(False)
    # graphs traced without the Checkpointer's router hooks must not be reused once they are registered
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    for layer in model.model.layers:
        _compile_method(layer, "forward")
        _compile_method(layer, "ffn")
    _compile_method(model.image_head, "run", dynamic_rows=True)


def compiled_graphs() -> int:
    """Graphs `torch.compile` has compiled in this process so far (each compile and each recompile adds one)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
