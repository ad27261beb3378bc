"""AdamW with parameter groups (no weight decay on norms, biases and embeddings) and a warmup + cosine
learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from lumina.training.errors import ConfigError


@dataclass
class OptimConfig:
    """lr:            peak learning rate, reached after `warmup_steps` optimizer steps.
    min_lr_ratio:  the cosine decays from lr to lr * min_lr_ratio at `decay_steps`, then stays there.
    decay_steps:   optimizer step where the cosine ends; None = the trainer's max_steps.
    weight_decay:  applied to matrices only (see `split_decay`).
    fused:         torch's fused AdamW kernel; None = where it runs (`fused_supported`).
    """

    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 10
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1
    fused: bool | None = None

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # Hydra hands over a ListConfig
        if not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ConfigError(f"optim.lr={self.lr!r}: must be > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={list(self.betas)!r}: expected two values in [0, 1)")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay={self.weight_decay!r}: must be >= 0")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps!r}: must be an integer >= 0")
        if self.decay_steps is not None and (not isinstance(self.decay_steps, int) or self.decay_steps < 1):
            raise ConfigError(f"optim.decay_steps={self.decay_steps!r}: must be None or an integer >= 1")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio!r}: must lie in [0, 1]")


def is_no_decay(name: str, param: nn.Parameter, owner: nn.Module) -> bool:
    """Norm weights, biases, embedding tables and other non-matrix parameters get no weight decay."""
    leaf = name.rsplit(".", 1)[-1]
    return (
        param.dim() < 2
        or leaf == "bias"
        or isinstance(owner, nn.Embedding)
        or "norm" in type(owner).__name__.lower()
        or "embed" in leaf
    )


def split_decay(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the trainable parameters with and without weight decay (frozen ones are left out)."""
    decay, no_decay = [], []
    for module_name, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            name = f"{module_name}.{leaf}" if module_name else leaf
            (no_decay if is_no_decay(name, param, module) else decay).append(name)
    return decay, no_decay


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters: group 0 decays, group 1 does not."""
    params = dict(model.named_parameters())
    decay, no_decay = split_decay(model)
    if not decay and not no_decay:
        raise ConfigError("model.freeze leaves no trainable parameter; the optimizer would have nothing to train")
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": cfg.weight_decay, "names": decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "names": no_decay},
    ]
    fused = cfg.fused if cfg.fused is not None else fused_supported([params[n] for n in decay + no_decay])
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused)


def fused_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these: plain floating tensors, all on CPU or all on CUDA."""
    device_types = {p.device.type for p in params}
    return (len(device_types) == 1 and device_types <= {"cpu", "cuda"}
            and all(p.is_floating_point() and not isinstance(p, DTensor) for p in params))


def warmup_cosine(step: int, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """Peak-lr multiplier at step `step` (0-based): warmup, then cosine to `min_lr_ratio` at `decay_steps`."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    span = max(decay_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else max_steps
    if decay_steps is None or decay_steps < 1:
        raise ConfigError(f"optim.decay_steps={cfg.decay_steps!r} with trainer.max_steps={max_steps!r}: "
                          "set one of them to a positive number of optimizer steps")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, cfg.warmup_steps, decay_steps, cfg.min_lr_ratio))
