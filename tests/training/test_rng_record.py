"""The RNG record that travels with a checkpoint (`lumina.training.module.rng_state`): it reads back with
`torch.load(weights_only=True)` and restores every generator training draws from, the CUDA one included. The
CUDA part is checked on CPU too: a real `torch.Generator` stands in for the device generator (`DeviceRNG`), and
`device_rng` is checked to hand the record torch.cuda's own getter and setter for the device."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

import lumina.training.module as module
from lumina.training.module import DeviceRNG, _set_rng_state, device_rng, rng_state


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


def test_device_rng_is_torch_cuda_s_getter_and_setter_of_that_device() -> None:
    assert device_rng(torch.device("cpu")) is None
    device = torch.device("cuda", 1)
    rng = device_rng(device)
    assert rng is not None
    assert (rng.get.func, rng.get.args, rng.get.keywords) == (torch.cuda.get_rng_state, (device,), {})
    assert (rng.set.func, rng.set.args, rng.set.keywords) == (torch.cuda.set_rng_state, (), {"device": device})


def test_the_cuda_part_is_recorded_and_restored_through_a_stand_in_generator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole record / restore for a CUDA device, with a CPU `torch.Generator` as that device's generator."""
    generator = torch.Generator().manual_seed(11)
    real = device_rng
    monkeypatch.setattr(module, "device_rng", lambda device: DeviceRNG(generator.get_state, generator.set_state)
                        if device.type == "cuda" else real(device))
    device = torch.device("cuda", 0)
    torch.rand(5, generator=generator)  # a state other than the seed's
    state = saved_and_loaded(rng_state(device))
    assert set(state) == {"torch", "numpy", "python", "cuda"}
    assert torch.equal(state["cuda"], generator.get_state())
    want = torch.rand(5, generator=generator)
    assert not torch.equal(torch.rand(5, generator=generator), want)  # the generator moved on
    _set_rng_state(state, device)
    assert torch.equal(torch.rand(5, generator=generator), want)
    _set_rng_state(saved_and_loaded(rng_state(torch.device("cpu"))), device)  # a CPU record leaves it as it is
    assert not torch.equal(torch.rand(5, generator=generator), want)
