"""EP=2 x FSDP=2 on 2 gloo ranks (packs with 3 vs 60 supervised text tokens, images on one rank only) against
one process on the union batch: gradients, the clipping norm, the clipped SGD step, expert load with and
without activation checkpointing, and the split HF checkpoint loaded into / exported from the shards."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import FEW, MANY, assert_close_by_name, expert_load, make_pack, tiny_config, union

from lumina.checkpoint import HFCheckpoint, load_pretrained
from lumina.model import LuminaModel
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig


@pytest.fixture(scope="module")
def single_process() -> dict:
    torch.manual_seed(0)
    model = LuminaModel(tiny_config())
    batch = union(make_pack(FEW, seed=10), make_pack(MANY, seed=11))
    output = model(batch)
    result = LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=False)))(output, batch)
    result.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))  # naive: one flat vector
    with torch.no_grad():
        for p in model.parameters():  # clip to half the norm, then plain SGD
            p -= 0.1 * p.grad * (0.5 * norm / (norm + 1e-6)).float()
    return {"grads": grads, "norm": norm, "weights": model.state_dict(), "load": expert_load(output, model.config.num_experts),
            "num_text": int(result.num_text_global)}


def test_every_reduced_gradient_equals_one_process(core, single_process) -> None:
    want = single_process["grads"]
    assert single_process["num_text"] == 3 + 60
    for rank in (0, 1):
        got = core("parity", rank)["grads"]
        assert got.keys() == want.keys()
        assert_close_by_name(got, want)
    experts = want["model.layers.1.mlp.experts.gate_proj"]
    assert experts[:4].abs().sum() > 0 and experts[4:].abs().sum() > 0  # both ep ranks' experts got tokens


@pytest.mark.parametrize(("layout", "expert_rows"), [("parity_ep1", 4), ("parity_hsdp", 8)])
def test_other_layouts_gradients_and_norm_equal_one_process(core, single_process, layout, expert_rows) -> None:
    """EP=1 x expert-FSDP=2 (experts FSDP-sharded: 4 of 8 rows per rank) and HSDP replicate=2 x shard=1 (every
    rank holds all 8; gradients all-reduced over the replicate dim): each reduction divides exactly once."""
    for rank in (0, 1):
        got = core(layout, rank)
        assert got["local_expert_rows"] == expert_rows
        assert got["grads"].keys() == single_process["grads"].keys()
        assert_close_by_name(got["grads"], single_process["grads"])
        assert float(got["norm"]) == pytest.approx(float(single_process["norm"]), rel=1e-5)


def test_clipping_norm_and_clipped_step_equal_one_process(core, single_process) -> None:
    for rank in (0, 1):
        got = core("parity", rank)
        assert float(got["norm"]) == pytest.approx(float(single_process["norm"]), rel=1e-5)
        assert float(got["clip_norm"]) == pytest.approx(float(single_process["norm"]), rel=1e-5)
        assert_close_by_name(got["weights"], single_process["weights"], rtol=1e-5)


def test_expert_load_sums_to_one_process_and_one_host_sync_per_layer(core, single_process) -> None:
    ranks = [core("parity", r) for r in (0, 1)]
    assert torch.equal(ranks[0]["load"] + ranks[1]["load"], single_process["load"])
    assert [r["host_syncs"] for r in ranks] == [[1, 1], [1, 1]]  # two MoE layers, one forward
    assert [r["checks"] for r in ranks] == [1, 1]  # the participation check ran (and passed) once


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_activation_checkpointing_keeps_expert_load_and_gradients(core, policy) -> None:
    for rank in (0, 1):
        off, on = core("parity", rank), core(f"checkpointing_{policy}", rank)
        assert on["replayed"] == 2  # both MoE layers were recomputed in backward, with the recorded top-k
        assert torch.equal(on["load"], off["load"])
        for name, grad in off["grads"].items():
            assert torch.equal(on["grads"][name], grad), name  # bit for bit, as on one device


def test_split_hf_checkpoint_loads_into_meta_sharded_model(core, reference_state) -> None:
    single = load_pretrained(core.out / "hf_in").state_dict()
    for rank in (0, 1):
        got = core("hf_load", rank)
        assert got["local_expert_rows"] == 4  # 8 experts over ep=2
        assert got["weights"].keys() == single.keys()
        for name, value in single.items():
            assert torch.equal(got["weights"][name], value), name
            assert torch.equal(value, reference_state[name]), name


def test_export_from_the_sharded_model_loads_back(core, reference_state) -> None:
    exported = HFCheckpoint(core.out / "hf_export")
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in exported.tensors  # official split layout
    back = load_pretrained(core.out / "hf_export").state_dict()
    for name, value in reference_state.items():
        assert torch.equal(back[name], value), name


def test_bf16_mixed_precision_policy_keeps_fp32_master_weights_and_gradients(core) -> None:
    for rank in (0, 1):
        fp32, bf16 = core("parity", rank)["grads"], core("mixed_precision", rank)
        assert bf16["dtypes"] == ["torch.float32"]  # sharded parameters and reduced gradients
        diff = torch.sqrt(sum((bf16["grads"][n] - g).pow(2).sum() for n, g in fp32.items()))
        scale = torch.sqrt(sum(g.pow(2).sum() for g in fp32.values()))
        assert 0 < float(diff / scale) < 0.05  # bf16 compute took effect and stays close


def test_strategy_loads_init_from_into_the_shards(core, reference_state) -> None:
    for rank in (0, 1):
        assert core("init_from", rank)["loaded_by_strategy"]  # the model reached the strategy on meta
        got = core("init_from", rank)["weights"]
        assert got.keys() == reference_state.keys()
        for name, value in reference_state.items():
            assert torch.equal(got[name], value), name
