"""Keeping sampling ranks in lockstep under FSDP2 / expert parallelism: every rank samples its own prompts,
but all must issue the same forwards, so the samplers agree (one small all-reduce) on whether any rank still
has work, and a rank without work runs a dummy one-prompt batch. Without a process group these are no-ops.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# (submodule path, method) the samplers call instead of forward; under FSDP2 each must unshard its unit.
SAMPLER_METHODS = (("", "backbone"), ("", "sample_image_codes"), ("image_head", "sample"))


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest `value` of all ranks (one all-reduce)."""
    if not distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool, device: torch.device) -> bool:
    """True if `flag` holds on at least one rank."""
    return max_over_ranks(int(flag), device) > 0


def shard_indices(num_items: int) -> list[int]:
    """This rank's share of item indices: rank, rank + world, ... (every item on exactly one rank)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed() else (0, 1)
    return list(range(rank, num_items, world))


def prepare_for_sampling(model: nn.Module) -> nn.Module:
    """Under FSDP2, register the sampler entry points of every sharded unit as forward methods, so calling
    them gathers that unit's parameters like `forward` does. Idempotent; unsharded models pass through."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    for path, name in SAMPLER_METHODS:
        module = model.get_submodule(path) if path else model
        flag = f"_lumina_sampling_{name}"
        if isinstance(module, FSDPModule) and not getattr(module, flag, False):
            register_fsdp_forward_method(module, name)
            setattr(module, flag, True)
    return model


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's parameters (a DTensor's local device under FSDP2)."""
    param = next(model.parameters())
    local = getattr(param, "to_local", None)
    return local().device if callable(local) else param.device
