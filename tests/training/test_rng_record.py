"""The RNG record that travels with a checkpoint (`lumina.training.module.rng_state`): it reads back with
`torch.load(weights_only=True)` and restores every generator training draws from, the CUDA one included."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from lumina.training.module import _set_rng_state, rng_state


def draws(device: torch.device) -> list:
    return [torch.randn(3).tolist(), torch.randn(3, device=device).tolist(), np.random.rand(2).tolist(),
            random.random()]


def saved_and_loaded(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def restores_the_draws(device: torch.device) -> None:
    torch.manual_seed(5)
    state = saved_and_loaded(rng_state(device))
    want = draws(device)
    assert draws(device) != want  # the generators moved on
    _set_rng_state(state, device)
    assert draws(device) == want


def test_the_record_reads_back_with_weights_only_and_restores_the_cpu_generators() -> None:
    state = rng_state(torch.device("cpu"))
    assert set(state) == {"torch", "numpy", "python"}
    restores_the_draws(torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_record_holds_and_restores_the_cuda_generator() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    assert "cuda" in rng_state(device)
    restores_the_draws(device)
