"""The analytic training FLOPs (`lumina.model.flops`) against torch's FlopCounterMode on the tiny model: one
forward, the objective and the backward on a real pack of the built-in world (2 samples + tail padding)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from lumina.contract.roles import IGNORE_INDEX
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.flops import attention_pairs, batch_flops, pack_attention_pairs, training_flops
from lumina.model.supervision import PackRows, segment_lengths
from lumina.objective import LuminaObjective
from lumina.training.data_factory import build_datamodule

aten = torch.ops.aten


def _grouped_mm(a, b, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001 - FlopCounterMode passes shapes
    """torch._grouped_mm: [m, n] x [E, n, p] or [m, n_total] x [n_total, p] (groups along n) -> 2 m n p;
    [E, m, n] x [E, n, p] -> 2 E m n p."""
    m, n = a[-2:]
    return 2 * m * n * b[-1] * (a[0] if len(a) == 3 and len(b) == 3 else 1)


# ops torch's registry lacks: SDPA's CPU kernel (torch's own SDPA formulas), the grouped GEMM of the experts and
# the in-place addmm_ (the fused head losses and the expert loop accumulate weight gradients with it)
CPU_OPS = {
    aten.addmm_: lambda acc, a, b, *args, out_shape=None, **kwargs: 2 * a[0] * a[1] * b[1],
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad, q, k, v, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(grad, q, k, v),
    aten._grouped_mm: _grouped_mm,
}


@pytest.fixture(scope="module")
def world_pack():
    config = LuminaConfig.tiny()
    data = {"seq_len": 256, "pad_id": 0, "num_codebooks": 4,
            "sources": [{"name": "world", "weight": 1.0, "path": None,
                         "options": {"num_samples": 24, "val_samples": 4}}]}
    dm = build_datamodule(data, config)
    dm.setup("fit")
    for batch in dm.train_dataloader():  # the first pack with text and image targets, a source image, tail padding
        rows = PackRows.of(batch)
        padded = sum(segment_lengths(batch)) < batch.seq_len
        if rows.text and rows.image and rows.image_inputs > rows.image and padded:
            return batch
    raise AssertionError("no pack holds text and image targets")


def measured_flops(backend: str, batch) -> tuple[int, LuminaConfig]:
    torch.manual_seed(0)
    config = LuminaConfig.tiny(attn_backend=backend)
    model = LuminaModel(config)
    counter = FlopCounterMode(display=False, custom_mapping=CPU_OPS)
    with counter:
        LuminaObjective()(model(batch), batch).loss.backward()
    return counter.get_total_flops(), config


@pytest.mark.parametrize("backend", ["sdpa_dense", "segmented"])
def test_analytic_training_flops_match_the_flop_counter(world_pack, backend: str) -> None:
    lengths = segment_lengths(world_pack)
    seq_len = world_pack.seq_len
    assert len(lengths) >= 2 and sum(lengths) < seq_len  # several samples and tail padding
    rows, pairs = PackRows.of(world_pack), pack_attention_pairs(world_pack, backend)
    assert rows.text > 0 and rows.image > 0 and rows.image_inputs > rows.image
    measured, config = measured_flops(backend, world_pack)
    analytic = training_flops(config, rows, pairs)
    assert analytic == pytest.approx(measured, rel=0.02)
    # the attention pairs differ by backend: the full S x S matrix vs one block per sample
    want = seq_len * seq_len if backend == "sdpa_dense" else sum(n * n for n in lengths)
    assert pairs == want


def test_segmented_attention_saves_what_the_counter_sees(world_pack) -> None:
    dense, config = measured_flops("sdpa_dense", world_pack)
    segmented, _ = measured_flops("segmented", world_pack)
    saved = [batch_flops(config, world_pack, b) for b in ("sdpa_dense", "segmented")]
    assert dense - segmented > 0.1 * dense
    assert saved[0] - saved[1] == pytest.approx(dense - segmented, rel=0.02)


def test_flex_counts_the_visible_pairs_of_the_block_diffusion_mask(world_pack) -> None:
    lengths = segment_lengths(world_pack)
    flex = attention_pairs(world_pack, "flex")
    assert 0 < flex < sum(n * n for n in lengths)  # noisy answers see less than their whole sample
    with pytest.raises(ValueError, match="'auto' names no backend: resolve it first"):
        attention_pairs(world_pack, "auto")


def test_heads_cost_only_supervised_rows(world_pack) -> None:
    # unlabel half of the supervised rows: the head FLOPs the counter sees fall as the analytic count says
    fewer = dataclasses.replace(world_pack, labels=world_pack.labels.clone())
    supervised = (fewer.labels[0] != IGNORE_INDEX).any(dim=1).nonzero()[:, 0]
    fewer.labels[0, supervised[::2]] = IGNORE_INDEX
    before, after = PackRows.of(world_pack), PackRows.of(fewer)
    assert after.image < before.image and after.positions == before.positions
    measured = [measured_flops("segmented", b)[0] for b in (world_pack, fewer)]
    config = LuminaConfig.tiny()
    analytic = [batch_flops(config, b, "segmented") for b in (world_pack, fewer)]
    assert measured[0] - measured[1] > 0.05 * measured[0]
    assert analytic[0] - analytic[1] == pytest.approx(measured[0] - measured[1], rel=0.02)


@pytest.mark.parametrize("backend", ["sdpa_dense", "segmented"])
def test_sequence_parallel_windows_add_up_to_the_pack(world_pack, backend: str) -> None:
    """Each sp rank counts its own rows and 1/sp of the pack's attention (it attends with heads / sp)."""
    from lumina.distributed.sequence_parallel import SequenceShard

    windows = [SequenceShard(rank, 2, 0).local(world_pack) for rank in (0, 1)]
    whole, parts = PackRows.of(world_pack), [PackRows.of(w) for w in windows]
    for field in ("positions", "image_inputs", "text", "image"):
        assert sum(getattr(p, field) for p in parts) == getattr(whole, field), field
    pairs = [pack_attention_pairs(w, backend) for w in windows]
    assert sum(pairs) == pack_attention_pairs(world_pack, backend)
