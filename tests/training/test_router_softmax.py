"""The softmax top-k router (`score_function: softmax`, `router=softmax`), a part added as new files only: its
routing rule, no expert bias (the bias update refuses it), a real training run on the built-in world whose
loss falls, its DCP checkpoint resumed and read back, lumina's fused HF layout written and read back, and the
official split layout refusing it by name. (Its activation-checkpointing replay is covered for every
registered router by tests/model/test_checkpointing.py.)"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from train_helpers import run_cli, small_data

from lumina.checkpoint import load_pretrained, save_pretrained
from lumina.distributed import load_dcp_weights
from lumina.model import ROUTERS, LuminaConfig, LuminaModel
from lumina.model.routers.softmax import SoftmaxTopKRouter
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

SOFTMAX = dict(score_function="softmax")
STEPS = 6
RUN = ["experiment=ablation_router_softmax", "strategy=fsdp_ep", "logger=csv", "trainer.val_check_interval=3",
       "trainer.limit_val_batches=1", "callbacks.checkpoint.every_n_train_steps=3", "callbacks.progress_bar=null",
       "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", *small_data(num_samples=48)]


def test_softmax_is_registered_and_not_official() -> None:
    assert ROUTERS.get("softmax", "score_function") is SoftmaxTopKRouter
    assert not ROUTERS.is_official("softmax") and ROUTERS.is_official("sigmoid")


def test_weights_are_the_softmax_at_the_top_k_renormalised() -> None:
    torch.manual_seed(0)
    router = SoftmaxTopKRouter(LuminaConfig.tiny(**SOFTMAX))
    x = torch.randn(32, router.weight.shape[1])
    routing = router(x)
    probs = torch.softmax(x @ router.weight.T, dim=-1)
    top = probs.topk(router.top_k, dim=-1)
    assert torch.equal(routing.topk_ids, top.indices)  # no group limit: the k most probable of all E experts
    torch.testing.assert_close(routing.topk_weights, top.values / top.values.sum(-1, keepdim=True))
    raw = SoftmaxTopKRouter(LuminaConfig.tiny(norm_topk_prob=False, **SOFTMAX))
    raw.load_state_dict(router.state_dict())
    torch.testing.assert_close(raw(x).topk_weights, top.values)  # norm_topk_prob off: the probabilities
    torch.testing.assert_close(router.balance_probs(routing.logits), probs)


def test_it_has_no_expert_bias_and_the_bias_update_refuses_it() -> None:
    model = LuminaModel(LuminaConfig.tiny(**SOFTMAX))
    assert not any("expert_bias" in key for key in model.state_dict())
    assert all(type(moe.gate) is SoftmaxTopKRouter for moe in model.moe_layers())
    with pytest.raises(ValueError, match=r"router 'model.layers.1.mlp.gate' \(.*SoftmaxTopKRouter\) has none"):
        LuminaObjective(ObjectiveConfig(balance=BalanceConfig(bias_update=True))).configure_routers(model)


def test_fused_layout_round_trips_and_the_split_layout_refuses_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(**SOFTMAX))
    with pytest.raises(ValueError, match=r"score_function='softmax'"):
        save_pretrained(model, tmp_path / "split", layout="split")
    assert not (tmp_path / "split").exists()  # refused before writing
    save_pretrained(model, tmp_path / "fused", layout="fused")
    loaded = load_pretrained(tmp_path / "fused")
    assert all(type(moe.gate) is SoftmaxTopKRouter for moe in loaded.moe_layers())
    want, got = model.state_dict(), loaded.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[key], want[key]) for key in want)


def train_losses(run_dir: Path) -> dict[int, float]:
    """train/loss by optimizer step over every process of the run (each writes its own CSV version)."""
    losses = {}
    for metrics in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        losses.update({int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(metrics.open())
                       if r.get("train/loss")})
    return losses


def test_trains_resumes_from_dcp_and_exports_the_fused_layout(tmp_path: Path) -> None:
    """lumina-train with the FSDP2 strategy (one CPU process): the loss falls; the step-3 DCP checkpoint
    resumes the run in a new process; the DCP weights and the end-of-run fused HF export read back equal."""
    run_dir = tmp_path / "run"
    first = run_cli([*RUN, f"hydra.run.dir={run_dir}", f"trainer.max_steps={STEPS // 2}"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run_dir / "checkpoints" / "last.ckpt" / ".metadata").is_file()  # a DCP checkpoint directory
    second = run_cli([*RUN, f"hydra.run.dir={run_dir}", f"trainer.max_steps={STEPS}"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]

    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(STEPS))  # the second process trained steps 3.. only (it resumed)
    assert max(losses[s] for s in range(STEPS - 2, STEPS)) < min(losses[s] for s in range(2))  # it learns

    hf = run_dir / "hf"
    exported = json.loads((hf / "config.json").read_text())
    assert exported["score_function"] == "softmax" and exported["model_type"] == "llada2_moe_veomni"
    from_hf = load_pretrained(hf)
    assert all(type(moe.gate) is SoftmaxTopKRouter for moe in from_hf.moe_layers())
    torch.manual_seed(1)
    from_dcp = load_dcp_weights(LuminaModel(from_hf.config), run_dir / "checkpoints" / "last.ckpt")
    want, got = from_hf.state_dict(), from_dcp.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[key], want[key]) for key in want)
