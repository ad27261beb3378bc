"""4 gloo ranks at EP=2 x expert-FSDP=2, the smallest layout where an expert tensor is split on two mesh dims
(Shard(0) on ep, FSDP2's _StridedShard on expert_fsdp) as at EP=8 x FSDP=8: the split HF checkpoint loads into
the shards, and the reduced gradients and the clipping norm equal one process on the global batch."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import FEW, MANY, assert_close_by_name, make_pack, tiny_config, union

from lumina.model import LuminaModel
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig


@pytest.fixture(scope="module")
def four_results(four) -> list[dict]:
    return [four("four", rank) for rank in range(4)]


@pytest.fixture(scope="module")
def one_process() -> dict:
    torch.manual_seed(0)
    model = LuminaModel(tiny_config())
    pair = union(make_pack(FEW, seed=10), make_pack(MANY, seed=11))  # ranks 0, 2: FEW; ranks 1, 3: MANY
    batch = union(pair, pair)
    LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)))(model(batch), batch).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))  # naive: one flat vector
    return {"grads": grads, "norm": norm}


def test_expert_tensors_are_split_on_both_mesh_dims(four_results) -> None:
    for got in four_results:
        assert got["placements"] == ["Replicate", "_StridedShard", "Shard"]
        assert got["local_expert_rows"] == 2  # 8 experts / (ep 2 x expert_fsdp 2)


def test_split_hf_checkpoint_loads_into_the_shards(four_results, reference_state) -> None:
    for got in four_results:
        assert got["weights"].keys() == reference_state.keys()
        for name, value in reference_state.items():
            assert torch.equal(got["weights"][name], value), name


def test_gradients_and_clipping_norm_equal_one_process(four_results, one_process) -> None:
    for got in four_results:
        assert_close_by_name(got["grads"], one_process["grads"])
        assert float(got["norm"]) == pytest.approx(float(one_process["norm"]), rel=1e-5)
