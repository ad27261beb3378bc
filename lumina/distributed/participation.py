"""Hang proofing: which conditional modules joined this rank's autograd graph, compared across ranks.

FSDP2 reduce-scatters a module's gradients only on ranks whose graph contains it, so a rank that skipped a
modality leaves the others hanging. `ParticipationTracker.check` (before backward) compares the recorded
modules across ranks and raises the same `ParticipationError` on every rank, naming modules and ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class ParticipationError(RuntimeError):
    """Ranks disagree on which conditional modules take part in backward."""


def in_backward() -> bool:
    """True while autograd runs a backward pass (e.g. an activation-checkpoint recompute)."""
    return torch._C._current_graph_task_id() != -1


def _requires_grad(output: object) -> bool:
    if isinstance(output, torch.Tensor):
        return output.requires_grad
    if isinstance(output, tuple | list):
        return any(_requires_grad(o) for o in output)
    return False


def tracked_modules(conditional: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The called modules behind `conditional_modules()`: a ModuleList's members, else the module."""
    out = {}
    for name, module in conditional.items():
        if isinstance(module, nn.ModuleList):
            out.update({f"{name}.{i}": child for i, child in enumerate(module)})
        else:
            out[name] = module
    return out


class ParticipationTracker:
    """Forward hooks on `modules` (name -> module) and a reset hook on `root`'s forward."""

    def __init__(self, root: nn.Module, modules: dict[str, nn.Module]) -> None:
        self.names = list(modules)
        self.joined: set[str] = set()
        self.checks = 0
        root.register_forward_pre_hook(self._reset)
        for name, module in modules.items():
            module.register_forward_hook(self._recorder(name))

    def _reset(self, module: nn.Module, args: object) -> None:
        if not in_backward():
            self.joined.clear()

    def _recorder(self, name: str):
        def record(module: nn.Module, args: object, output: object) -> None:
            if not in_backward() and _requires_grad(output):  # a recompute records nothing
                self.joined.add(name)
        return record

    def check(self, group: dist.ProcessGroup | None = None) -> None:
        """All-gather the records (one small collective) and raise ParticipationError on a mismatch."""
        self.checks += 1
        mine = torch.tensor([name in self.joined for name in self.names], dtype=torch.int32)
        world = dist.get_world_size(group)
        table = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(table, mine, group=group)
        rows = torch.stack(table)  # [world, modules]
        differ = (rows != rows[0]).any(0)
        if not bool(differ.any()):
            return
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
        parts = []
        for m in differ.nonzero().flatten().tolist():
            took = [ranks[r] for r in range(world) if rows[r, m]]
            skipped = [ranks[r] for r in range(world) if not rows[r, m]]
            parts.append(f"{self.names[m]} (joined backward on ranks {took}, absent on ranks {skipped})")
        raise ParticipationError("conditional modules disagree across ranks before backward; FSDP would wait in "
                                 "a collective that never completes: " + "; ".join(parts))
