"""conf/strategy/ builds the strategy it documents, and `parallelize` (what the strategy's setup calls)
refuses a bad plan before it changes the model (one gloo rank in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import tiny_config
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.distributed.fsdp import FSDPModule

from lumina.distributed import (
    OFFICIAL_PLAN,
    FSDP2ExpertParallelStrategy,
    ParallelConfig,
    PlanError,
    build_meshes,
    parallelize,
    parse_plan,
)
from lumina.model import GroupedExperts, LuminaModel

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def _strategy(name: str, *overrides: str) -> FSDP2ExpertParallelStrategy:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"strategy={name}", *overrides])
    return instantiate(cfg.strategy)


def test_gpu_strategy_conf_is_bf16_params_fp32_reduce() -> None:
    strategy = _strategy("fsdp_ep_gpu", "strategy.parallel.ep=8")
    assert isinstance(strategy, FSDP2ExpertParallelStrategy)
    assert strategy.parallel == ParallelConfig(ep=8, param_dtype="bfloat16", reduce_dtype="float32")
    assert strategy.rules == OFFICIAL_PLAN
    assert strategy._timeout.total_seconds() == 1800  # handed to the process group


@pytest.mark.parametrize(("key", "knob"), [("activation_checkpointing", "model.config.gradient_checkpointing=full"),
                                           ("conditional_rule", "every conditional module always joins")])
def test_a_removed_strategy_key_names_the_knob_to_use(key: str, knob: str) -> None:
    with pytest.raises(Exception, match=rf"strategy\.parallel\.{key} was removed; use .*{knob}"):
        _strategy("fsdp_ep", f"+strategy.parallel.{key}=true")


def test_strategy_conf_rejects_a_bad_size_naming_it() -> None:
    with pytest.raises(Exception, match=r"ParallelConfig.ep=0"):
        _strategy("fsdp_ep", "strategy.parallel.ep=0")


@pytest.fixture
def one_rank_group(tmp_path: Path):
    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(("plan", "match"), [
    (["model.layers.*.moe.w1"], r"match no parameter.*moe\.w1"),
    (["model.layers.*.mlp.experts.gate_proj", "model.layers.*.mlp.experts.up_proj"],
     r"leaves 2 expert tensor\(s\) unplaced.*down_proj"),
])
def test_parallelize_refuses_a_bad_plan_before_changing_the_model(one_rank_group, plan, match) -> None:
    config = ParallelConfig()
    with torch.device("meta"):
        model = LuminaModel(tiny_config())
    with pytest.raises(PlanError, match=match):
        parallelize(model, build_meshes(config.resolve(1), "cpu"), config, parse_plan(plan), torch.device("cpu"))
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert all(isinstance(m.experts, GroupedExperts) for m in model.moe_layers())


def test_lightning_autocast_on_top_of_the_fsdp2_policy_is_refused_naming_the_value() -> None:
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=FSDP2ExpertParallelStrategy(), precision="bf16-mixed",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with pytest.raises(ValueError, match=r"trainer.precision='bf16-mixed'.*param_dtype"):
        trainer.strategy.setup(trainer)


def test_unit_by_unit_init_equals_one_device_init(one_rank_group) -> None:
    """The strategy materialises a meta model unit by unit as it shards; the same seed gives the same
    initial weights as building the model on one device (so runs compare across layouts)."""
    torch.manual_seed(3)
    want = LuminaModel(tiny_config()).state_dict()
    config = ParallelConfig()
    with torch.device("meta"):
        model = LuminaModel(tiny_config())
    torch.manual_seed(3)
    parallelize(model, build_meshes(config.resolve(1), "cpu"), config, OFFICIAL_PLAN, torch.device("cpu"))
    got = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize(("sp", "world", "match"), [
    (0, 2, r"ParallelConfig.sp=0: must be an integer >= 1"),
    (3, 2, r"ParallelConfig.sp=3 does not divide the world size 2"),
])
def test_a_bad_sequence_parallel_size_is_refused_naming_it(sp, world, match) -> None:
    with pytest.raises(ValueError, match=match):
        ParallelConfig(sp=sp).resolve(world)


@pytest.mark.parametrize(("sp", "heads", "kv_heads", "match"), [
    (3, 4, 2, r"strategy.parallel.sp=3 does not divide num_attention_heads=4"),
    (2, 6, 3, r"strategy.parallel.sp=2 and num_key_value_heads=3: one must divide the other"),
])
def test_heads_that_sp_cannot_split_are_refused(sp, heads, kv_heads, match) -> None:
    from lumina.distributed.sequence_parallel import check_heads

    with pytest.raises(ValueError, match=match):
        check_heads(sp, heads, kv_heads)
    check_heads(4, 8, 2)  # fewer kv heads than sp: replicated, allowed
