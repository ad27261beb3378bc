"""`estimate_step_memory` and `lumina-train estimate_memory=true`: the parameter count equals the module tree's,
the activation count equals what autograd saves, the estimate is within 25% of a measured step's peak-RSS rise
(fresh subprocess, experiments/bench/step_memory.py), `model.freeze` globs take exactly their parameters'
gradients and AdamW states out, and the CLI prints the table and the fit verdict."""

from __future__ import annotations

import fnmatch
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import compose_train, quiet, run_cli

from lumina.cli.memory import estimate_from_cfg
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.params import parameter_counts
from lumina.model.supervision import PackRows
from lumina.objective import LuminaObjective
from lumina.training.errors import ConfigError
from lumina.training.memory_estimate import GIB, Precision, channel_head_bytes_per_row, estimate_step_memory
from lumina.training.module import LuminaModule
from lumina.training.optim import OptimConfig, build_optimizer

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "experiments" / "bench"
sys.path.insert(0, str(BENCH))
from step_memory import SMALL_CONFIG, world_pack  # noqa: E402 - the benchmark's model and pack

SMALL = LuminaConfig.official(**SMALL_CONFIG, attn_backend="segmented")
TEST_FIELDS = {"vocab_size": 4096, "pad_token_id": 0}  # the small config with a short vocabulary: a quick step
needs_peak_reset = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                      reason="resets the kernel's peak-RSS mark through /proc/self/clear_refs")


@pytest.mark.parametrize("config", [
    LuminaConfig.tiny(),
    SMALL,
    LuminaConfig.official(),
    LuminaConfig.tiny(num_shared_experts=None, use_qkv_bias=True, use_bias=True, first_k_dense_replace=0),
], ids=["tiny", "small", "official", "tiny-variant"])
def test_parameter_counts_split_the_model_into_its_fsdp_units(config: LuminaConfig) -> None:
    """The units (conditional modules, decoder layers) plus the final norm hold every parameter once; the
    routed experts are 3 E I H per MoE layer."""
    counts = parameter_counts(config)
    with torch.device("meta"):
        every_parameter = sum(p.numel() for p in LuminaModel(config).parameters())
    assert sum(map(sum, counts.units.values())) + config.hidden_size == counts.total == every_parameter
    moe_intermediate, hidden = config.moe_intermediate_size, config.hidden_size
    assert counts.experts == config.num_moe_layers * 3 * config.num_experts * moe_intermediate * hidden


def test_the_heads_weight_gradients_are_counted_unsharded_under_fsdp() -> None:
    """The fused losses hold [V, H] and C x [K, H] weight gradients from the forward to the backward: under
    FSDP those of the unsharded weights (1.2 GiB for the official text head in fp32), on one rank none extra."""
    config = LuminaConfig.official()
    heads = (config.vocab_size + config.num_codebooks * config.codebook_size) * config.hidden_size
    single = estimate_step_memory(config, 4096, "full")
    sharded = estimate_step_memory(config, 4096, "full", shard=8, ep=8)
    assert sharded.head_losses - single.head_losses == heads * 4
    assert config.vocab_size * config.hidden_size * 4 / GIB == pytest.approx(1.2, abs=0.01)


def saved_activation_bytes(model: LuminaModel, batch) -> int:  # noqa: ANN001 - a PackedBatch
    """Bytes of the distinct storages autograd saves in forward + objective (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        LuminaObjective()(model(batch), batch)
    return sum(storages.values())


def test_the_channel_head_count_per_row_is_what_cpu_autograd_keeps() -> None:
    """The estimate measures the channel head on the meta device; CPU kernels keep within 1% of it per row."""
    config = LuminaConfig.tiny()
    torch.manual_seed(0)
    head = LuminaModel(config).multi_codebook_head
    params = {p.untyped_storage().data_ptr() for p in [*head.parameters(), *head.buffers()]}

    def kept(rows: int) -> int:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        h = torch.randn(rows, config.hidden_size, requires_grad=True)
        prefix = torch.randn(rows, config.num_codebooks - 1, config.hidden_size, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            head(h, prefix)
        return sum(storages.values())

    per_row = (kept(6) - kept(2)) / 4
    assert channel_head_bytes_per_row(config, 4) == pytest.approx(per_row, rel=0.01)


def test_activation_count_equals_what_autograd_saves() -> None:
    config = LuminaConfig.tiny(attn_backend="segmented")
    batch = world_pack(512, num_codebooks=config.num_codebooks)
    rows = PackRows.of(batch)
    assert rows.image > 0 and rows.text > 0, rows  # the pack exercises both heads
    torch.manual_seed(0)
    saved = saved_activation_bytes(LuminaModel(config), batch)
    estimate = estimate_step_memory(config, 512, "none", rows)
    assert abs(estimate.activations / saved - 1) < 0.05, (estimate.activations, saved)


def test_checkpointing_keeps_less_and_the_backbone_scales_with_seq_len() -> None:
    rows = PackRows(positions=4096, text=0, image=0, image_inputs=0, segment_len=64)
    act = {p: estimate_step_memory(SMALL, 4096, p, rows).activations for p in ("none", "selective", "full")}
    assert act["none"] > act["selective"] > act["full"], act
    long = estimate_step_memory(SMALL, 8192, "full", PackRows(8192, 0, 0, 0, 64))
    assert long.activation_bytes_per_token == pytest.approx(act["full"] / 4096, rel=0.02)
    image_rows = PackRows(4096, 0, 1000, 1000, 64)
    channel_head = 1000 * 8 * 6 * 32 * 256 * 4  # 32 D per position and block
    images = estimate_step_memory(SMALL, 4096, "none", image_rows)
    assert images.activations > act["none"] + channel_head
    # full / selective checkpoint the channel head in chunks of CHANNEL_CHECKPOINT_ROWS rows
    images_full = estimate_step_memory(SMALL, 4096, "full", image_rows)
    assert act["full"] < images_full.activations < act["full"] + channel_head / 2


def test_sharding_divides_the_parameter_state() -> None:
    single = estimate_step_memory(LuminaConfig.official(), 4096, "full")
    sharded = estimate_step_memory(LuminaConfig.official(), 4096, "full", shard=8, ep=8)
    assert sharded.parameters == math.ceil(single.parameter_count / 8) * 4
    assert sharded.optimizer_states == 2 * sharded.parameters
    assert single.fsdp_buffers == 0 < sharded.fsdp_buffers
    assert sharded.activations == single.activations


@pytest.mark.parametrize(("call", "match"), [
    (lambda: estimate_step_memory(SMALL, 0), r"seq_len=0"),
    (lambda: estimate_step_memory(SMALL, 64, "sometimes"), r"policy='sometimes'"),
    (lambda: estimate_step_memory(SMALL, 64, optimizer="adam"), r"optimizer='adam'"),
    (lambda: estimate_step_memory(SMALL, 64, shard=4, ep=3), r"ep=3"),
    (lambda: PackRows.assume(64, text_rows=0.8, image_rows=0.5), r"memory_pack.text_rows=0.8"),
    (lambda: PackRows.assume(64, image_rows=1.5), r"memory_pack.image_rows=1.5"),
    (lambda: PackRows(positions=8, text=-1, image=0, image_inputs=0, segment_len=1), r"PackRows.text=-1"),
    (lambda: PackRows(positions=8, text=5, image=4, image_inputs=4, segment_len=1), r"more rows than positions=8"),
    (lambda: estimate_step_memory(SMALL, 64, rows=PackRows.assume(32)), r"rows.positions=32"),
    (lambda: Precision.of("8-bit"), r"trainer.precision='8-bit'"),
])
def test_bad_inputs_name_the_field(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def measured_step(seq_len: int, policy: str, tasks: dict[str, float]) -> dict:
    """experiments/bench/step_memory.py in a fresh process: its final JSON record."""
    command = [sys.executable, str(BENCH / "step_memory.py"), "--seq-len", str(seq_len), "--policy", policy,
               "--config", json.dumps(TEST_FIELDS), "--tasks", json.dumps(tasks), "--threads", "1"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_peak_reset
@pytest.mark.parametrize(("seq_len", "policy", "tasks"), [
    (1024, "none", {"t2i": 0.5, "text_qa": 0.5}),  # the channel head's image rows dominate
    (4096, "full", {"text_qa": 1.0}),  # the backbone (checkpointed) and the text head
])
def test_estimate_is_within_25_percent_of_a_measured_step(seq_len: int, policy: str, tasks: dict) -> None:
    record = measured_step(seq_len, policy, tasks)
    rows = PackRows(**record["rows"])
    assert record["peak_reset"] and rows.positions == seq_len
    estimate = estimate_step_memory(LuminaConfig.official(**record["config"]), seq_len, policy, rows,
                                    optimizer="sgd")
    assert 0.75 <= estimate.step_rise / record["rise_bytes"] <= 1.25, (estimate.step_rise, record["rise_bytes"])


def stderr_lines(result: subprocess.CompletedProcess) -> list[str]:
    """The non-blank lines of a CLI run's stderr."""
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_cli_prints_the_table_and_the_verdict(tmp_path: Path) -> None:
    args = ["estimate_memory=true", "memory_budget_gib=20", "data.seq_len=512", *quiet(tmp_path / "out")]
    expected = estimate_from_cfg(compose_train(args))
    result = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "memory estimate: seq_len 512, gradient_checkpointing=none" in result.stdout
    for part in ("parameters", "gradients", "optimizer states", "activations", "head losses"):
        assert f"\n  {part} " in result.stdout, result.stdout
    peak = next(line for line in result.stdout.splitlines() if line.startswith("  peak "))
    assert peak.split()[1] == f"{expected.peak / GIB:.3f}", peak
    assert result.stdout.rstrip().endswith("fits in 20 GiB: yes")
    assert not (tmp_path / "out" / "checkpoints").exists()  # nothing was trained


def test_cli_refuses_a_config_over_the_budget(tmp_path: Path) -> None:
    result = run_cli(["estimate_memory=true", "memory_budget_gib=0.01", f"hydra.run.dir={tmp_path / 'run'}",
                      *quiet(tmp_path / "out")], cwd=tmp_path)
    assert result.returncode == 2
    assert "fits in 0.01 GiB: no" in result.stdout
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("lumina-train: error: memory_budget_gib=0.01:"), result.stderr


@pytest.mark.parametrize("budget", ["-1", "abc"])
def test_cli_bad_budget_is_one_line_naming_the_field(budget: str, tmp_path: Path) -> None:
    result = run_cli(["estimate_memory=true", f"memory_budget_gib={budget}", f"hydra.run.dir={tmp_path / 'run'}",
                      *quiet(tmp_path / "out")], cwd=tmp_path)
    assert result.returncode == 2
    lines = stderr_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"lumina-train: error: memory_budget_gib={budget!r}" if budget == "abc"
                               else f"lumina-train: error: memory_budget_gib={budget}:"), lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_config_estimate_follows_the_strategy_and_the_pack(tmp_path: Path) -> None:
    base = ["data.seq_len=1024", *quiet(tmp_path)]
    single = estimate_from_cfg(compose_train(base))
    sharded = estimate_from_cfg(compose_train([*base, "strategy=fsdp_ep", "trainer.devices=2",
                                               "strategy.parallel.ep=2", "model.config.gradient_checkpointing=full"]))
    assert (sharded.shard, sharded.ep, sharded.policy) == (2, 2, "full")
    assert sharded.parameters == math.ceil(single.parameter_count / 2) * 4
    text_only = estimate_from_cfg(compose_train([*base, "memory_pack.image_rows=0", "memory_pack.text_rows=1"]))
    assert text_only.activations < single.activations
    with pytest.raises(ConfigError, match=r"memory_pack.no_such_key: unknown key"):
        estimate_from_cfg(compose_train([*base, "+memory_pack.no_such_key=1"]))
    fsdp2 = [*base, "strategy=fsdp_ep", "trainer.devices=2"]
    sp2 = estimate_from_cfg(compose_train([*fsdp2, "strategy.parallel.sp=2"]))
    half = estimate_from_cfg(compose_train([*fsdp2, "data.seq_len=512"]))
    assert (sp2.sp, sp2.seq_len) == (2, 512)  # a rank holds half the pack's rows
    assert sp2.activations == half.activations < single.activations


FROZEN = ["*.mlp.experts.*", "model.word_embeddings.*"]
PARAM_DTYPES = {"32-true": torch.float32, "bf16-true": torch.bfloat16, "64-true": torch.float64,
                "bf16-mixed": torch.float32}  # Lightning's precision -> the dtype parameters are kept in


def frozen_bytes(config: LuminaConfig, globs: list[str], dtype: torch.dtype) -> int:
    """Bytes of the parameters matching `globs` in a model built on the meta device and cast to `dtype`."""
    with torch.device("meta"):
        model = LuminaModel(config).to(dtype)
    hits = [p for name, p in model.named_parameters() if any(fnmatch.fnmatchcase(name, g) for g in globs)]
    return sum(p.numel() * p.element_size() for p in hits)


@pytest.mark.parametrize(("shard", "ep"), [(1, 1), (4, 2)], ids=["one-device", "fsdp-ep-per-rank"])
@pytest.mark.parametrize("precision", list(PARAM_DTYPES))
def test_freeze_globs_cut_exactly_the_frozen_gradient_and_optimizer_bytes(precision: str, shard: int,
                                                                           ep: int) -> None:
    """Frozen parameters have no gradient, no AdamW exp_avg / exp_avg_sq and no share of the optimizer step's
    temporaries; everything else (parameters, activations, FSDP buffers) is unchanged."""
    config = LuminaConfig.tiny()
    frozen = frozen_bytes(config, FROZEN, PARAM_DTYPES[precision])
    assert frozen > 0 and frozen % shard == 0  # every rank holds 1 / shard of them
    per_rank = frozen // shard
    kwargs = dict(precision=Precision.of(precision), shard=shard, ep=ep)
    full = estimate_step_memory(config, 512, "full", **kwargs)
    part = estimate_step_memory(config, 512, "full", freeze=FROZEN, **kwargs)
    assert full.gradients - part.gradients == per_rank
    assert full.optimizer_states - part.optimizer_states == 2 * per_rank
    assert full.optimizer_step - part.optimizer_step == per_rank
    assert (part.parameters, part.activations, part.fsdp_buffers) == (full.parameters, full.activations,
                                                                      full.fsdp_buffers)
    assert part.activations + part.head_losses > full.optimizer_step  # so the peak falls by the state alone
    assert full.peak - part.peak == 3 * per_rank


def test_the_estimate_counts_the_parameters_the_optimizer_trains() -> None:
    """What LuminaModule hands its optimizer under `freeze` is what the estimate gives gradients to."""
    config = LuminaConfig.tiny()
    module = LuminaModule(config, freeze=FROZEN)
    module.configure_model()
    optimizer = build_optimizer(module.model, OptimConfig())
    trained = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    estimate = estimate_step_memory(config, 512, "full", freeze=FROZEN)
    assert estimate.trainable_count == trained < estimate.parameter_count
    assert estimate.gradients == trained * 4


def test_config_estimate_counts_the_freeze_globs_per_rank(tmp_path: Path) -> None:
    """`model.freeze` reaches the estimate of a composed config, per rank under strategy=fsdp_ep; a glob that
    matches nothing, or a value that is not a list, is an error naming model.freeze."""
    base = ["data.seq_len=512", "strategy=fsdp_ep", "trainer.devices=4", "strategy.parallel.ep=2", *quiet(tmp_path)]
    full = estimate_from_cfg(compose_train(base))
    part = estimate_from_cfg(compose_train([*base, f"model.freeze=[{','.join(repr(g) for g in FROZEN)}]"]))
    per_rank = frozen_bytes(LuminaConfig.tiny(), FROZEN, torch.float32) // 4
    assert (part.shard, part.ep) == (4, 2)
    assert full.gradients + full.optimizer_states - part.gradients - part.optimizer_states == 3 * per_rank
    with pytest.raises(ConfigError, match=r"model.freeze='model\.no_such\.\*': matches no parameter"):
        estimate_from_cfg(compose_train([*base, "model.freeze=['model.no_such.*']"]))
    with pytest.raises(ConfigError, match=r"model.freeze='lm_head\.weight': must be a list"):
        estimate_from_cfg(compose_train([*base, "model.freeze=lm_head.weight"]))


def test_cli_prints_the_smaller_figure_under_freeze(tmp_path: Path) -> None:
    """`lumina-train estimate_memory=true model=official model.freeze=['*.mlp.experts.*']` prints the
    gradients, AdamW states and optimizer step less the routed experts' share (15.3B of the 16.9B
    parameters), and the smaller peak."""
    args = ["estimate_memory=true", "model=official", "data.seq_len=512", "model.config.gradient_checkpointing=full",
            *quiet(tmp_path / "out")]
    full = estimate_from_cfg(compose_train(args))
    frozen = frozen_bytes(LuminaConfig.official(), ["*.mlp.experts.*"], torch.float32)
    result = run_cli([*args, "model.freeze=['*.mlp.experts.*']", f"hydra.run.dir={tmp_path / 'run'}"],
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = {line[2:20].strip(): line[20:].split() for line in result.stdout.splitlines()
               if line.startswith("  ")}
    trainable = full.parameter_count - frozen // 4
    assert printed["gradients"][:2] == [f"{(full.gradients - frozen) / GIB:.3f}", f"{trainable / 1e6:.1f}M"]
    assert printed["optimizer states"][0] == f"{(full.optimizer_states - 2 * frozen) / GIB:.3f}"
    assert printed["optimizer step"][0] == f"{(full.optimizer_step - frozen) / GIB:.3f}"
    # the optimizer step's temporaries outweighed the activations: the peak falls by more than the state
    part = estimate_from_cfg(compose_train([*args, "model.freeze=['*.mlp.experts.*']"]))
    assert printed["peak"][0] == f"{part.peak / GIB:.3f}"
    assert part.peak <= full.peak - 3 * frozen
