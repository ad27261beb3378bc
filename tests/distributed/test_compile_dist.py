"""`apply_compile` under FSDP2 + EP on 2 gloo ranks (and with sequence parallelism): the compiled layers give
the eager sharded model's loss and every gradient (the `compile` scenario of dist_worker.py)."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import run_scenario

RTOL, ATOL = 2e-4, 1e-8  # per gradient tensor, as tests/model/test_compile.py states for fp32


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory):
    # compiling on two ranks of a 2-core machine: minutes when the inductor cache is cold
    return run_scenario("compile", tmp_path_factory.mktemp("dist_compile"), expect_ok=True, timeout_s=1200)


@pytest.mark.parametrize("run", ["ep", "ep_sp"])
def test_compiled_layers_give_the_eager_sharded_gradients(compiled, run: str) -> None:
    for rank in (0, 1):
        result = compiled("compile", rank)[run]
        eager, got = result["eager"], result["compiled"]
        torch.testing.assert_close(got["loss"], eager["loss"], rtol=1e-5, atol=0)
        assert got["grads"].keys() == eager["grads"].keys() and eager["grads"]
        for name, want in eager["grads"].items():
            error = (got["grads"][name] - want).abs().max().item()
            assert error <= RTOL * want.abs().max().item() + ATOL, f"rank {rank} {name}: max error {error:.3g}"
