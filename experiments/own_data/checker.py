"""A picture classifier fitted on a drawn dataset's real training pictures, to judge generated ones (T2I).

Pictures are made polarity-free first (|pixel - median| / std: light-on-dark and dark-on-light read alike),
then a small CNN (three 3 x 3 conv layers, 32 / 64 / 128 channels, max-pooling, global average pooling, a
linear layer) is fitted with AdamW for `steps` batches of 64, seeded, each batch shifted by up to `shift` px
and rotated by up to 10 degrees (augmentation: a few hundred pictures are too few to learn position
invariance). It never sees a generated picture; its accuracy on the real held-out pictures is the ceiling
for a T2I score.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

STEPS = 6000  # batches of 64 (~85 passes over 4.5k pictures); 568 (8 passes) read real shapes at 0.84


def normalise(pictures: torch.Tensor) -> torch.Tensor:
    """[N, H, W] grey levels (any range) -> [N, 1, H, W], polarity-free and standardised per picture."""
    flat = pictures.float().flatten(1)
    x = (flat - flat.median(dim=1, keepdim=True).values).abs()
    x = (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True).clamp_min(1e-6)
    return x.view(pictures.shape[0], 1, *pictures.shape[1:])


def classifier(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(128, num_classes),
    )


def augment(x: torch.Tensor, shift: int) -> torch.Tensor:
    """[B, 1, H, W] -> each picture shifted by up to `shift` px and rotated by up to 10 degrees (zero fill)."""
    angle = (torch.rand(len(x)) * 2 - 1) * torch.pi / 18
    offset = (torch.rand(len(x), 2) * 2 - 1) * shift * 2 / x.shape[-1]
    theta = torch.stack(
        [
            torch.stack([angle.cos(), -angle.sin(), offset[:, 0]], 1),
            torch.stack([angle.sin(), angle.cos(), offset[:, 1]], 1),
        ],
        1,
    )
    grid = nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return nn.functional.grid_sample(x, grid, align_corners=False)


def fit(
    pictures: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int = 10,
    steps: int = STEPS,
    seed: int = 0,
    shift: int = 4,
) -> nn.Module:
    """pictures [N, H, W], labels [N] -> the fitted classifier (eval mode), after `steps` batches of 64."""
    torch.manual_seed(seed)
    model = classifier(num_classes)
    x = normalise(pictures)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=steps)
    batches = (b for _ in itertools.count() for b in torch.randperm(len(x)).split(64))  # endless passes
    for batch in itertools.islice(batches, steps):
        loss = nn.functional.cross_entropy(model(augment(x[batch], shift)), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


@torch.no_grad()
def predict(model: nn.Module, pictures: torch.Tensor) -> torch.Tensor:
    return model(normalise(pictures)).argmax(dim=1)
