"""Sequence parallelism (sp=2) on 2 gloo ranks, against one process on the whole pack: the pack has an odd
length (padded to a multiple of sp) and segments that cross the split; for the block-diffusion pack the clean
memory of noisy blocks sits on the other rank. Then the Lightning runs: a rank whose rows hold no image target,
DCP resume at sp=2 and loading at sp=1; and 4 ranks at sp=2 x ep=2 against dp=2."""

from __future__ import annotations

import functools

import pytest
import torch
from dist_helpers import FEW, MANY, assert_close_by_name, block_pack, make_pack, tiny_config, union

from lumina.model import LuminaModel
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

PACKS = {"union": lambda: union(make_pack(FEW, seed=10), make_pack(MANY, seed=11)),
         "block": lambda: block_pack(seed=5)}
CASES = {  # the worker's sequence_parity runs: (pack, model overrides)
    "sp_segmented": ("union", {}),
    "sp_sdpa_dense": ("union", {"attn_backend": "sdpa_dense"}),
    "sp_block": ("block", {}),
    "sp_kv_replicated": ("union", {"num_key_value_heads": 1}),  # 1 kv head serves both ranks
}


@functools.cache
def one_process(case: str) -> dict:
    pack_name, overrides = CASES[case]
    torch.manual_seed(0)
    model = LuminaModel(tiny_config(**overrides))
    batch = PACKS[pack_name]()
    result = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)))(model(batch), batch)
    result.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))
    with torch.no_grad():
        for p in model.parameters():  # clip to half the norm, then plain SGD (as the worker)
            p -= 0.1 * p.grad * (0.5 * norm / (norm + 1e-6)).float()
    return {"loss": result.loss.detach(), "grads": grads, "norm": norm, "weights": model.state_dict(),
            "seq_len": batch.seq_len}


@pytest.mark.parametrize("case", list(CASES))
def test_sp2_step_equals_one_process(core, case) -> None:
    want = one_process(case)
    assert want["seq_len"] % 2 == 1  # the pack is padded for the split
    for rank in (0, 1):
        got = core(case, rank)
        assert got["rows"] == (want["seq_len"] + 1) // 2  # each rank holds half the (padded) rows
        torch.testing.assert_close(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
        assert got["grads"].keys() == want["grads"].keys()
        assert_close_by_name(got["grads"], want["grads"])
        assert float(got["norm"]) == pytest.approx(float(want["norm"]), rel=1e-5)
        assert float(got["clip_norm"]) == pytest.approx(float(want["norm"]), rel=1e-5)
        assert_close_by_name(got["weights"], want["weights"], rtol=1e-5)


def test_block_pack_puts_clean_memory_on_the_other_rank() -> None:
    """The block case is the one it claims to be: noisy block 2 (rank 0's rows) reads clean memory rows of
    blocks 0 and 1 that fall in rank 1's half."""
    from lumina.attention import build_spec

    pack = block_pack(seed=5)
    half = (pack.seq_len + 1) // 2
    allowed = build_spec(pack, backend="sdpa_dense").allowed(slice(0, pack.seq_len), slice(0, pack.seq_len))[0]
    noisy_block_2 = 4 + 8  # first row of the noisy answer's block 2
    memory_rows = allowed[noisy_block_2].nonzero().flatten()
    assert bool(pack.is_clean[0, memory_rows[memory_rows >= half]].all())
    assert (memory_rows >= half).any() and noisy_block_2 < half


def test_a_rank_without_image_targets_trains_like_sp1(core) -> None:
    for rank in (0, 1):
        runs = core("sequence_runs", rank)
        sp2, sp1 = runs["sp2"], runs["sp1"]
        assert sp2["rows"] == [28] * 3 and sp1["rows"] == [56] * 3
        assert (sp2["image_rows"] == [0] * 3) == (rank == 0)  # rank 0's half has no image target
        assert sp2["checks"] == [1, 2, 3]  # the participation check ran before every backward and passed
        assert sp2["losses"] == pytest.approx(sp1["losses"], rel=1e-5)


def test_dcp_resume_at_sp2_continues_identically_and_loads_at_sp1(core) -> None:
    ranks = [core("sequence_runs", r)["resume"] for r in (0, 1)]
    for got in ranks:
        full, resumed = got["full"], got["resumed"]
        assert len(full["losses"]) == 4 and resumed["losses"] == full["losses"][2:]
        assert resumed["batches"] == full["batches"][2:]
        for name, weight in full["snapshots"]["end"]["weights"].items():
            assert torch.equal(resumed["snapshots"]["end"]["weights"][name], weight), name
        sp1 = got["reloaded"]
        assert sp1["step"] == 2
        for name, weight in full["snapshots"][2]["weights"].items():
            assert torch.equal(sp1["weights"][name], weight), name
    assert ranks[0]["full"]["packs"] == ranks[1]["full"]["packs"]  # one pack per step for the group ...
    assert all(a != b for a, b in zip(ranks[0]["full"]["batches"], ranks[1]["full"]["batches"], strict=True))
    assert [got["reloaded"]["data_parallel"] for got in ranks] == [(0, 2), (1, 2)]  # ... re-dealt over 2 at sp=1


@pytest.fixture(scope="module")
def dp2_reference(core) -> dict:
    """dp=2 on 2 ranks (EP=2), rank 0 training FEW and rank 1 MANY: the core run's parity scenario."""
    return core("parity", 0)


def test_sp2_x_ep2_on_four_ranks_equals_dp2(four_ranks, dp2_reference) -> None:
    for rank, got in enumerate(four_ranks):
        assert got["sp_ranks"] == ([0, 1] if rank < 2 else [2, 3])
        assert_close_by_name(got["grads"], dp2_reference["grads"])
        assert float(got["norm"]) == pytest.approx(float(dp2_reference["norm"]), rel=1e-5)
