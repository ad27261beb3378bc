"""LoRA (rank 4, every default target: attention, dense MLP, shared and routed experts; the text head trained
whole, `modules_to_save`) under FSDP2 + EP=2 on 2 gloo ranks with the real Lightning Trainer, from a split HF
base (`init_from`): the same losses as one process on the union of the ranks' packs (so the text head starts
from `init_from` too), only the adapter and the text head get gradients and optimizer state, the routed
experts' factors are split along E like their experts, the DCP checkpoint holds no frozen base and resumes at
EP=2, loads at EP=1 and into one process, and the end-of-run export is the merged model plus the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed.checkpoint as dcp
from dist_helpers import FEW, MANY, make_pack, run_scenario, tiny_config, union
from dist_worker import LORA, FixedPacks, lora_module

from lumina.adapters import LoRA, load_peft_adapter, merged_state_dict
from lumina.checkpoint import load_pretrained, save_pretrained
from lumina.distributed import load_dcp_weights
from lumina.model import LuminaModel

STEPS = 4
SAVED = [f"{name}.weight" for name in LORA["modules_to_save"]]  # the text head, trained whole


@pytest.fixture(scope="module")
def lora_dist(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("dist_lora")
    torch.manual_seed(0)
    save_pretrained(LuminaModel(tiny_config()), out / "hf_in", layout="split")
    load = run_scenario("adapters", out, expect_ok=True, timeout_s=400)
    return [load("lora", rank) for rank in (0, 1)], out / "hf_in"


@pytest.fixture(scope="module")
def one_process(lora_dist) -> list[float]:
    """The same fine-tune in one process (Lightning, one CPU device) on the union of the two packs."""
    _, hf_in = lora_dist
    module = lora_module(str(hf_in))
    L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_progress_bar=False,
              enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
              gradient_clip_val=1.0).fit(module, datamodule=FixedPacks([union(make_pack(FEW, seed=10),
                                                                              make_pack(MANY, seed=11))]))
    return module.loss_history


def test_losses_equal_one_process(lora_dist, one_process) -> None:
    ranks, _ = lora_dist
    assert len(one_process) == STEPS and one_process[-1] < one_process[0] - 0.05  # the adapter learns
    for got in ranks:
        print("EP=2 losses", got["losses"], "one process", one_process)
        assert got["losses"] == pytest.approx(one_process, rel=1e-5)


def test_activation_checkpointing_keeps_the_losses(lora_dist) -> None:
    for got in lora_dist[0]:
        assert got["checkpointed_losses"] == pytest.approx(got["losses"][:2], rel=1e-6)


def test_only_the_adapter_and_the_saved_head_get_gradients_and_optimizer_state_and_the_base_stays(lora_dist):
    ranks, hf_in = lora_dist
    base = load_pretrained(hf_in).state_dict()
    for got in ranks:
        names = sorted(got["adapter_names"])
        assert any(".experts.lora_B.down_proj" in n for n in names) and any(".dense.lora_A" in n for n in names)
        trained = sorted(names + SAVED)
        assert got["with_grad"] == [trained] * STEPS  # no frozen parameter ever holds a (reduced) gradient
        assert got["optimizer_params"] == trained and got["optimizer_states"] == len(trained)
        weights = got["weights"]
        assert sorted(k for k in weights if k not in base) == names
        for key, value in base.items():
            if key in SAVED:
                assert not torch.equal(weights[key], value), key
            else:
                assert torch.equal(weights[key], value), key  # the frozen base, expert bias included
        assert any(weights[n].abs().max() > 0 for n in names if ".experts.lora_B" in n)


def test_expert_factors_are_split_along_experts_like_the_experts(lora_dist) -> None:
    for got in lora_dist[0]:
        assert got["lora_experts"]
        assert got["factor_on_ep"] == ("ep", True) and got["factor_like_base"]
        assert got["factor_local_rows"] == tiny_config().num_experts // 2
        assert got["reloaded_rows"] == tiny_config().num_experts // 2  # EP=1: all 8, FSDP-sharded over 2 ranks


def test_the_dcp_checkpoint_holds_the_adapter_and_buffers_only(lora_dist) -> None:
    ranks, _ = lora_dist
    stored = dcp.FileSystemReader(ranks[0]["ckpt"]).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("state_dict.model.") for k in stored if k.startswith("state_dict.")}
    plain = LuminaModel(tiny_config())
    buffers = {k for k in plain.state_dict() if k not in dict(plain.named_parameters())}
    assert buffers and model_keys == set(ranks[0]["adapter_names"]) | set(SAVED) | buffers
    assert any(k.startswith("optimizer_0.state.") and ".lora_A" in k for k in stored)


def test_dcp_resumes_at_ep2_and_loads_at_ep1_and_in_one_process(lora_dist) -> None:
    ranks, hf_in = lora_dist
    for got in ranks:
        assert got["resumed_losses"] == got["losses"][2:]  # bit for bit
        assert got["reloaded_step"] == 2
        assert got["reloaded"].keys() == got["step2"].keys()
        for key, value in got["step2"].items():
            assert torch.equal(got["reloaded"][key], value), key
    model = load_pretrained(hf_in)
    names = LoRA(rank=LORA["rank"], alpha=LORA["alpha"]).apply(model)
    load_dcp_weights(model, ranks[0]["ckpt"], keys=names + SAVED)
    state = model.state_dict()
    for key, value in ranks[0]["step2"].items():
        assert torch.equal(state[key], value), key


def test_a_resume_without_the_init_from_that_holds_the_base_is_refused_naming_it(lora_dist) -> None:
    ranks, hf_in = lora_dist
    for got in ranks:
        message = got["no_base_error"]
        assert message is not None and "holds no 'model.model." in message
        assert "resume with that model.init_from" in message and f"checkpoint's run: {str(hf_in)!r}" in message


def test_the_export_is_the_merged_model_and_the_adapter(lora_dist) -> None:
    ranks, hf_in = lora_dist
    export = Path(ranks[0]["export"])
    trained = LuminaModel(tiny_config())
    LoRA(rank=LORA["rank"], alpha=LORA["alpha"]).apply(trained)
    trained.load_state_dict(ranks[0]["weights"])
    merged = load_pretrained(export).state_dict()
    for key, value in merged_state_dict(trained).items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=0, msg=key)
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["modules_to_save"]) == (LORA["rank"], LORA["modules_to_save"])
    adapted = load_pretrained(hf_in)
    load_peft_adapter(adapted, export / "adapter")
    state = adapted.state_dict()
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(state[key], value), key
