"""Lightning + FSDP2ExpertParallelStrategy at EP=2 on 2 gloo ranks with the built-in world data: a DCP
checkpoint at step 2 resumes identically (losses, batches of both ranks, weights, expert_bias), loads at
EP=1, and loads into a single process."""

from __future__ import annotations

import torch
from dist_helpers import tiny_config

from lumina.distributed import load_dcp_weights
from lumina.model import LuminaModel


def _equal_states(got: dict, want: dict) -> None:
    assert got["weights"].keys() == want["weights"].keys()
    for name, weight in want["weights"].items():
        assert torch.equal(got["weights"][name], weight), name
    for a, b in zip(got["bias"], want["bias"], strict=True):
        assert torch.equal(a, b)


def test_resume_at_ep2_continues_identically(core) -> None:
    for rank in (0, 1):
        got = core("resume", rank)
        full, resumed = got["full"], got["resumed"]
        assert len(full["losses"]) == 4 and len(resumed["losses"]) == 2
        assert resumed["losses"] == full["losses"][2:]  # bit-identical continuation
        assert resumed["batches"] == full["batches"][2:]  # this rank's data cursor survived
        for a, b in zip(resumed["biases"], full["biases"][2:], strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        _equal_states(resumed["snapshots"]["end"], full["snapshots"]["end"])
        assert any(b.abs().sum() > 0 for b in full["snapshots"][2]["bias"])  # the bias update did run
    rank0, rank1 = (core("resume", r)["full"]["batches"] for r in (0, 1))
    assert all(a != b for a, b in zip(rank0, rank1, strict=True))  # the ranks train different packs


def test_checkpoint_loads_at_ep1_with_the_same_weights(core) -> None:
    for rank in (0, 1):
        got = core("resume", rank)
        assert got["reloaded"]["step"] == 2 and got["reloaded"]["local_expert_rows"] == 4  # 8 experts, FSDP over 2
        _equal_states(got["reloaded"], got["full"]["snapshots"][2])


def test_checkpoint_loads_into_one_process(core) -> None:
    got = core("resume", 0)
    model = load_dcp_weights(LuminaModel(tiny_config()), got["ckpt"])
    state = model.state_dict()
    _equal_states({"weights": {k: state[k] for k in got["full"]["snapshots"][2]["weights"]},
                   "bias": [m.gate.expert_bias for m in model.moe_layers()]}, got["full"]["snapshots"][2])
