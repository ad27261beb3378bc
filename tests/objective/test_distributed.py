"""Two real gloo processes (one spawn for every check) against one process on the union batch.

- DP: packs with 3 vs 60 supervised tokens; gradients all-reduce-averaged by hand equal the union's.
- Hang-proofing: every conditional module under its own FSDP2 `fully_shard` (plus the root); one rank has
  image targets and the other none (and the reverse for text); it completes within a timeout and its
  (reduce-scattered) gradients equal the union's.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from objective_dist_worker import build_model, run_worker, scenarios, union

from lumina.objective import LuminaObjective

WORLD = 2
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("objective_dist")
    ctx = mp.start_processes(run_worker, args=(WORLD, str(out / "init"), str(out)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail(f"the 2-process objective run did not finish in {TIMEOUT_S} s (hang)")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def references() -> dict[str, dict]:
    """One process, no torch.distributed: each scenario's union batch."""
    refs = {}
    for name, scenario in scenarios().items():
        model = build_model()
        objective = LuminaObjective(scenario.config)
        batch = union(*scenario.packs)
        result = objective(model(batch), batch)
        result.loss.backward()
        refs[name] = {
            "grads": {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()},
            "loss": result.loss.detach(),
            "num_text": result.num_text_global, "num_image": result.num_image_global,
            "bias_update": objective.on_optimizer_step(model),
        }
    return refs


def grad_norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))


def assert_grads_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert got[name] is not None, f"{name} has no gradient"
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert grad_norm(got) == pytest.approx(grad_norm(want), rel=1e-5)
    assert grad_norm(want) > 0


@pytest.mark.parametrize("name", ["dp_none", "dp_inverse_t"])
def test_dp_gradients_equal_the_union_batch(rank_results: list[dict], references: dict, name: str) -> None:
    ref = references[name]
    r0, r1 = rank_results[0][name], rank_results[1][name]
    assert r0["num_text"][0].item() != r1["num_text"][0].item()
    if name == "dp_none":
        assert (r0["num_text"][0].item(), r1["num_text"][0].item()) == (3, 40)
        assert (r0["num_image"][0].item(), r1["num_image"][0].item()) == (0, 20)
    for r in (r0, r1):
        assert r["num_text"][1].item() == ref["num_text"].item()
        assert r["num_image"][1].item() == ref["num_image"].item()
    # the mean of the ranks' losses is the union's global-token mean
    assert ((r0["loss"] + r1["loss"]) / 2).item() == pytest.approx(ref["loss"].item(), rel=1e-5)
    assert_grads_equal(r0["grads"], ref["grads"])
    assert_grads_equal(r1["grads"], ref["grads"])


def test_expert_bias_update_uses_counts_summed_over_ranks(rank_results: list[dict], references: dict) -> None:
    want = references["dp_none"]["bias_update"]
    for r in range(WORLD):
        got = rank_results[r]["dp_none"]
        torch.testing.assert_close(got["bias_update"], want)
        for layer, bias in enumerate(got["biases"]):
            torch.testing.assert_close(bias, want[layer].float())
    assert want.abs().sum() > 0


@pytest.mark.parametrize("name", ["fsdp_image_on_rank0", "fsdp_text_on_rank0"])
def test_fsdp_with_a_missing_modality_completes_and_matches_the_union(rank_results: list[dict], references: dict,
                                                                    name: str) -> None:
    r0, r1 = rank_results[0][name], rank_results[1][name]
    if name == "fsdp_image_on_rank0":
        assert r0["num_image"][0].item() > 0 and r1["num_image"][0].item() == 0
    else:
        assert r0["num_text"][0].item() > 0 and r1["num_text"][0].item() == 0
    for r in (r0, r1):
        assert r["conditional_without_grad"] == []
    assert_grads_equal(r0["grads"], references[name]["grads"])
    assert_grads_equal(r1["grads"], references[name]["grads"])
