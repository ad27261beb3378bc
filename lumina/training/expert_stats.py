"""Scalars and a heatmap that describe how evenly the router spreads tokens over the experts."""

from __future__ import annotations

import numpy as np
import torch


def load_stats(load: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-layer balance of load [L, E] (tokens routed to each expert) as [L] float64 tensors: max_over_mean
    (1 = even), cv (population std / mean), both 0 for a layer without tokens, and dead (experts without)."""
    if load.dim() != 2:
        raise ValueError(f"load must have shape [L, E], got {list(load.shape)}")
    x = load.detach().to(torch.float64).cpu()
    mean = x.mean(dim=1)
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))
    max_over_mean = torch.where(mean > 0, x.max(dim=1).values / safe, torch.zeros_like(mean))
    cv = torch.where(mean > 0, x.std(dim=1, correction=0) / safe, torch.zeros_like(mean))
    dead = (x == 0).sum(dim=1).to(torch.float64)
    return {"max_over_mean": max_over_mean, "cv": cv, "dead": dead}


def draw_heatmap(load: torch.Tensor, first_layer: int = 0, title: str = "expert load"):
    """A matplotlib Figure of the [L, E] load as shares of each layer's tokens (rows from `first_layer`)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    x = load.detach().to(torch.float64).cpu()
    share = x / x.sum(dim=1, keepdim=True).clamp_min(1.0)
    num_layers, num_experts = share.shape
    fig = Figure(figsize=(min(max(6.0, 2.0 + 0.06 * num_experts), 16.0), 2.0 + 0.35 * num_layers), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(share.numpy(), aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_yticks(range(num_layers), [str(first_layer + i) for i in range(num_layers)])
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="share of the layer's tokens")
    fig.tight_layout()
    return fig


def figure_rgb(figure) -> np.ndarray:  # noqa: ANN001 - a matplotlib Figure
    """A matplotlib Figure rendered to uint8 RGB [height, width, 3] (what image loggers take)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
