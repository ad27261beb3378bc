"""LuminaModel.forward: row selection, label checks, output shapes, the public sampler parts."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch

from lumina.model import LuminaConfig, LuminaModel, LuminaOutput

TYPES = [1, 2, 2, 1, 3, 3, 3, 1, 4, 4, 4, 3, 0]


def test_output_rows_shapes_and_router_outputs(tiny_model: LuminaModel) -> None:
    batch = make_batch(TYPES)
    batch.labels[0, 5, 0] = -100  # an unsupervised text row
    batch.labels[0, 9] = -100  # an unsupervised image row
    out = tiny_model(batch)
    cfg = tiny_model.config
    assert isinstance(out, LuminaOutput)
    assert out.hidden.shape == (1, len(TYPES), cfg.hidden_size)
    assert out.text_rows.tolist() == [4, 6, 11]
    assert out.image_rows.tolist() == [8, 10]
    assert out.heads.text_logits(out.text_states).shape == (3, cfg.vocab_size)
    assert out.heads.image_logits(out.image_states).shape == (2, cfg.num_codebooks, cfg.codebook_size)
    assert len(out.router_logits) == len(out.router_topk_ids) == len(out.router_topk_weights) == 2
    for logits, ids, weights in zip(out.router_logits, out.router_topk_ids, out.router_topk_weights, strict=True):
        assert logits.shape == (1, len(TYPES), cfg.num_experts) and logits.dtype == torch.float32
        assert ids.shape == (1, len(TYPES), cfg.num_experts_per_tok) and ids.dtype == torch.int64
        assert weights.shape == ids.shape
        torch.testing.assert_close(weights.sum(-1), torch.full((1, len(TYPES)), cfg.routed_scaling_factor))


def test_public_parts_reproduce_the_forward(tiny_model: LuminaModel) -> None:
    batch = make_batch(TYPES, seed=2)
    out = tiny_model(batch)
    hidden = tiny_model.backbone(batch)
    torch.testing.assert_close(hidden, out.hidden)
    flat = hidden.reshape(-1, hidden.shape[-1])
    heads = tiny_model.heads()
    torch.testing.assert_close(heads.text_logits(flat[out.text_rows]), heads.text_logits(out.text_states))
    codes = batch.labels.reshape(-1, batch.labels.shape[-1])[out.image_rows]
    states = tiny_model.multi_codebook_head(flat[out.image_rows], tiny_model.model.embed_codes(codes)[:, :-1])
    torch.testing.assert_close(heads.image_logits(states), heads.image_logits(out.image_states))


def test_without_labels_rows_come_from_query_rows(tiny_model: LuminaModel) -> None:
    batch = make_batch(TYPES, labelled=False, query_rows=[0, 4, 8, 9, 12])
    out = tiny_model(batch)
    assert out.text_rows.tolist() == [0, 4, 12]
    assert out.image_rows.tolist() == [8, 9]
    assert out.heads.text_logits(out.text_states).shape == (3, tiny_model.config.vocab_size)
    cfg = tiny_model.config
    assert out.heads.image_logits(out.image_states).shape == (0, cfg.num_codebooks, cfg.codebook_size)
    everything = tiny_model(make_batch(TYPES, labelled=False))
    assert everything.text_rows.tolist() == [s for s, t in enumerate(TYPES) if t != 4]


def test_text_only_batch_with_one_id_column(tiny_model: LuminaModel) -> None:
    batch = make_batch([1, 1, 3, 3], labelled=False)
    batch.input_ids = batch.input_ids[..., :1]
    out = tiny_model(batch)
    assert out.heads.text_logits(out.text_states).shape == (4, tiny_model.config.vocab_size)
    batch = make_batch([1, 2, 3, 3], labelled=False)
    batch.input_ids = batch.input_ids[..., :1]
    with pytest.raises(ValueError, match="input_ids has 1 columns"):
        tiny_model(batch)


@pytest.mark.parametrize(("row", "col", "value", "match"), [
    (8, 2, -5, r"labels row 8 .*type 4\) = \[\d+, \d+, -5, \d+\].*image labels must be non-negative"),
    (8, 1, 64, r"labels row 8 .*= \[\d+, 64, \d+, \d+\].*codebook_size=64"),
    (4, 0, 512, r"labels row 4 .*type 3\) = \[512, -100, -100, -100\].*\[0, vocab_size=512\)"),
    (0, 0, 7, r"labels row 0 .*type 1\) = \[7, -100, -100, -100\]: only type-3"),
    (2, 1, 7, r"labels row 2 .*type 2\).*only type-3"),
])
def test_bad_labels_raise_naming_labels(tiny_model: LuminaModel, row: int, col: int, value: int,
                                        match: str) -> None:
    batch = make_batch(TYPES)
    batch.labels[0, row, col] = value
    with pytest.raises(ValueError, match=match):
        tiny_model(batch)


def test_out_of_range_input_ids_raise(tiny_model: LuminaModel) -> None:
    batch = make_batch(TYPES)
    batch.input_ids[0, 0, 0] = 512
    with pytest.raises(ValueError, match="input_ids .text rows"):
        tiny_model(batch)
    batch = make_batch(TYPES)
    batch.input_ids[0, 1, 3] = 5010
    with pytest.raises(ValueError, match="image codes"):
        tiny_model(batch)


def test_image_codes_up_to_5009_embed(tiny_model: LuminaModel) -> None:
    batch = make_batch(TYPES, labelled=False)
    batch.input_ids[0, 8] = torch.tensor([5000, 5001, 5009, 0])  # mask / marker ids of the 5010-row tables
    assert tiny_model(batch).hidden.isfinite().all()


def test_bf16_model_runs_and_keeps_fp32_router_bias() -> None:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny()).to(torch.bfloat16)
    out = model(make_batch(TYPES))
    assert out.hidden.dtype == torch.bfloat16 and out.router_logits[0].dtype == torch.float32
    assert model.model.layers[1].mlp.gate.expert_bias.dtype == torch.float32
    assert model.multi_codebook_head.channel_mask.dtype == torch.bfloat16
