"""The parallel plan as data (single process): what it places, what makes it raise, and the per-rank
parameter bytes of the official 16B-A1B model at EP=8 x FSDP=8 computed from it on the meta device."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import tiny_config

from lumina.distributed import (
    OFFICIAL_PLAN,
    ParallelConfig,
    PlanError,
    PlanRule,
    parse_plan,
    resolve_plan,
)
from lumina.distributed.parallel_plan import expert_parameter_names
from lumina.distributed.parallelize import check_supported
from lumina.model import GroupedExperts, LuminaModel


@pytest.fixture(scope="module")
def tiny_names() -> tuple[list[str], list[str]]:
    with torch.device("meta"):
        model = LuminaModel(tiny_config())
    return [n for n, _ in model.named_parameters()], expert_parameter_names(model, (GroupedExperts,))


def test_official_plan_places_exactly_the_expert_projections(tiny_names) -> None:
    names, experts = tiny_names
    placed = resolve_plan(names, OFFICIAL_PLAN, experts)
    # tiny: layers 1 and 2 are MoE layers, three fused projections each
    assert sorted(placed) == sorted(f"model.layers.{i}.mlp.experts.{p}" for i in (1, 2)
                                    for p in ("gate_proj", "up_proj", "down_proj"))
    assert {(r.dim, r.mesh_dim) for r in placed.values()} == {(0, "ep")}


def test_split_key_patterns_alone_place_the_fused_tensors(tiny_names) -> None:
    names, experts = tiny_names
    split_only = parse_plan([{"pattern": f"model.layers.*.mlp.experts.*.{p}.weight"}
                             for p in ("gate_proj", "up_proj", "down_proj")])
    assert sorted(resolve_plan(names, split_only, experts)) == sorted(experts)


def test_a_plan_matching_nothing_raises(tiny_names) -> None:
    names, experts = tiny_names
    with pytest.raises(PlanError, match=r"match no parameter.*model\.layers\.\*\.moe\.w1"):
        resolve_plan(names, parse_plan(["model.layers.*.moe.w1"]), experts)


def test_a_plan_leaving_experts_unplaced_raises(tiny_names) -> None:
    names, experts = tiny_names
    with pytest.raises(PlanError, match=r"leaves 4 expert tensor\(s\) unplaced.*up_proj"):
        resolve_plan(names, parse_plan(["model.layers.*.mlp.experts.gate_proj"]), experts)


def test_an_empty_plan_and_a_double_placement_raise(tiny_names) -> None:
    names, experts = tiny_names
    with pytest.raises(PlanError, match="empty"):
        parse_plan([])
    with pytest.raises(PlanError, match="placed twice"):
        resolve_plan(names, (*OFFICIAL_PLAN, PlanRule("model.layers.1.mlp.experts.up_proj", dim=1)), experts)


def test_parallel_config_rejects_sizes_that_do_not_fit_the_world() -> None:
    assert ParallelConfig(ep=8).resolve(64).expert_fsdp == 8
    with pytest.raises(ValueError, match="ep=3 does not divide shard=4"):
        ParallelConfig(ep=3).resolve(4)
    with pytest.raises(ValueError, match="replicate=3 does not divide the world size 4"):
        ParallelConfig(replicate=3).resolve(4)
    with pytest.raises(ValueError, match=r"ParallelConfig.ep=0"):
        ParallelConfig(ep=0)


def _rows(n: int, ways: int) -> int:
    return -(-n // ways)


def test_placements_the_sharding_cannot_honour_raise(tiny_names) -> None:
    names, experts = tiny_names
    dense = resolve_plan(names, (*OFFICIAL_PLAN, PlanRule("lm_head.weight")), experts)
    with pytest.raises(PlanError, match=r"non-expert parameters.*lm_head\.weight"):
        check_supported(dense, experts)
    on_shard = resolve_plan(names, parse_plan([{"pattern": "model.layers.*.mlp.experts.*", "mesh_dim": "shard"}]),
                            experts)
    with pytest.raises(PlanError, match="only be placed on the 'ep' mesh dim"):
        check_supported(on_shard, experts)
    check_supported(resolve_plan(names, OFFICIAL_PLAN, experts), experts)  # the official plan is fine
