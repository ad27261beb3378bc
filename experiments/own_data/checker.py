"""A picture classifier fitted on a drawn dataset's real training pictures, to judge generated ones (T2I).

Pictures are made polarity-free first (|pixel - median| / std: light-on-dark and dark-on-light read alike),
then a small CNN (two 3 x 3 conv layers, 16 / 32 channels, max-pooling, a linear layer) is fitted with AdamW
for `epochs` passes, seeded. It never sees a generated picture; `fit` reports its accuracy on the real held-out
pictures, the ceiling for a T2I score.
"""

from __future__ import annotations

import torch
from torch import nn


def normalise(pictures: torch.Tensor) -> torch.Tensor:
    """[N, H, W] grey levels (any range) -> [N, 1, H, W], polarity-free and standardised per picture."""
    flat = pictures.float().flatten(1)
    x = (flat - flat.median(dim=1, keepdim=True).values).abs()
    x = (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True).clamp_min(1e-6)
    return x.view(pictures.shape[0], 1, *pictures.shape[1:])


def classifier(num_classes: int, size: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * (size // 4) ** 2, num_classes))


def fit(pictures: torch.Tensor, labels: torch.Tensor, num_classes: int = 10, epochs: int = 30,
        seed: int = 0) -> nn.Module:
    """pictures [N, H, W] (H = W, divisible by 4), labels [N] -> the fitted classifier (eval mode)."""
    torch.manual_seed(seed)
    model = classifier(num_classes, pictures.shape[-1])
    x = normalise(pictures)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    for _ in range(epochs):
        for batch in torch.randperm(len(x)).split(64):
            loss = nn.functional.cross_entropy(model(x[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


@torch.no_grad()
def predict(model: nn.Module, pictures: torch.Tensor) -> torch.Tensor:
    return model(normalise(pictures)).argmax(dim=1)
