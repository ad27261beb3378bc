"""The fused, chunked head losses against autograd through full fp32 logits (today's path before them):
values, CE, argmax and every gradient, at chunk sizes of one row, a few rows, N and more than N."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from objective_dist_worker import Segment, build_model, make_pack

from lumina.model.linear_ce import CHUNK_BYTES, auto_chunk_rows, linear_cross_entropy
from lumina.objective import LuminaObjective, ObjectiveConfig
from lumina.objective.labels import gather_targets

CHUNKS = [1, 3, 7, 1000, 0]  # N = 7 rows below; 0 = auto


def _inputs(num_rows: int = 7, hidden: int = 16, classes: int = 50, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, hidden, generator=g, requires_grad=True)
    weight = torch.randn(classes, hidden, generator=g, requires_grad=True)
    b = torch.randn(classes, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(0, classes, (num_rows,), generator=g)
    row_weight = torch.rand(num_rows, generator=g) + 0.1
    return x, weight, b, targets, row_weight


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_equals_autograd_through_full_logits(chunk: int, bias: bool) -> None:
    x, weight, b, targets, row_weight = _inputs(bias=bias)
    logits = F.linear(x, weight, b).float()
    ce_ref = F.cross_entropy(logits, targets, reduction="none")
    (ce_ref * row_weight).sum().mul(0.37).backward()
    ref = [t.grad.clone() for t in (x, weight, b) if t is not None]
    for t in (x, weight, b):
        if t is not None:
            t.grad = None

    loss = linear_cross_entropy(x, weight, b, targets, row_weight, chunk_rows=chunk)
    loss.total.mul(0.37).backward()
    torch.testing.assert_close(loss.total, (ce_ref * row_weight).sum(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss.per_row, ce_ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(loss.preds, logits.argmax(dim=1))
    assert not loss.per_row.requires_grad and not loss.preds.requires_grad
    for got, want in zip([t.grad for t in (x, weight, b) if t is not None], ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_head_upcasts_its_logits_like_autograd() -> None:
    x, weight, _, targets, row_weight = _inputs(bias=False)
    xb, wb = x.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    logits = F.linear(xb, wb).float()
    ce_ref = F.cross_entropy(logits, targets, reduction="none")
    (ce_ref * row_weight).sum().backward()
    ref_x, ref_w = xb.grad.clone(), wb.grad.clone()
    xb.grad = wb.grad = None
    loss = linear_cross_entropy(xb, wb, None, targets, row_weight, chunk_rows=2)
    loss.total.backward()
    torch.testing.assert_close(loss.per_row, ce_ref)  # the same bf16 logits, upcast
    assert xb.grad.dtype == wb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(xb.grad, ref_x, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(wb.grad, ref_w, rtol=2e-2, atol=1e-3)


def test_no_rows_give_a_connected_zero_and_zero_gradients() -> None:
    x, weight, b, targets, row_weight = _inputs(num_rows=0)
    loss = linear_cross_entropy(x, weight, b, targets, row_weight)
    assert loss.total.item() == 0.0 and loss.total.grad_fn is not None
    loss.total.backward()
    assert torch.count_nonzero(weight.grad) == 0 and torch.count_nonzero(b.grad) == 0


def test_a_second_backward_names_the_reason() -> None:
    x, weight, b, targets, row_weight = _inputs()
    total = linear_cross_entropy(x, weight, b, targets, row_weight).total * 2
    total.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        total.backward()


def test_bad_shapes_and_chunk_name_the_field() -> None:
    x, weight, b, targets, row_weight = _inputs()
    with pytest.raises(ValueError, match="row_weight"):
        linear_cross_entropy(x, weight, b, targets, row_weight[:3])
    with pytest.raises(ValueError, match="chunk_rows=-1"):
        linear_cross_entropy(x, weight, b, targets, row_weight, chunk_rows=-1)


def test_auto_chunk_keeps_a_chunk_of_logits_within_its_byte_budget() -> None:
    assert auto_chunk_rows(157184) * 157184 * 4 <= CHUNK_BYTES < (auto_chunk_rows(157184) + 1) * 157184 * 4
    assert auto_chunk_rows(2**30) == 1


def _full_logits_objective(output, batch, config: ObjectiveConfig) -> torch.Tensor:
    """The objective's head terms as computed before the fused losses: full fp32 logits, F.cross_entropy."""
    targets = gather_targets(batch.labels, output.text_rows, output.image_rows)
    text_logits = output.heads.text_logits(output.text_states).float()
    text_ce = F.cross_entropy(text_logits, targets.text, reduction="none")
    num_text = output.text_rows.numel()
    if config.text_weighting == "inverse_t":
        text_ce = text_ce / batch.noise_t.reshape(-1)[output.text_rows]
        num_text = int((batch.answer_mask & (batch.type_ids == 3)).sum())
    image_logits = output.heads.image_logits(output.image_states).float()
    image_ce = F.cross_entropy(image_logits.flatten(0, 1), targets.image.flatten(), reduction="none")
    image_ce = image_ce.view(targets.image.shape)
    text_loss = text_ce.sum() / max(num_text, 1)
    image_loss = image_ce.mean(-1).sum() / max(output.image_rows.numel(), 1)
    return config.text_weight * text_loss + config.image_weight * image_loss


@pytest.mark.parametrize("chunk", [1, 2, 5, 10_000, 0])
@pytest.mark.parametrize("weighting", ["none", "inverse_t"])
def test_objective_on_the_model_equals_full_logits_in_value_and_every_gradient(chunk: int, weighting: str) -> None:
    config = ObjectiveConfig(text_weight=0.8, image_weight=1.3, text_weighting=weighting)
    pack = make_pack([Segment(prompt=3, text=7, text_sup=5, image=6, image_sup=5),
                      Segment(prompt=2, text=4, text_sup=4)], seed=11, pad=2)
    reference = build_model()
    _full_logits_objective(reference(pack), pack, config).backward()
    model = build_model()
    model.config.loss_chunk_rows = chunk
    for head in [model.lm_head, *model.lm_img_head]:
        head.chunk_rows = chunk
    result = LuminaObjective(config)(model(pack), pack)
    result.loss.backward()
    with torch.no_grad():
        ref_loss = _full_logits_objective(reference(pack), pack, config)
    torch.testing.assert_close(result.loss, ref_loss, rtol=1e-6, atol=1e-6)
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        want = ref_grads[name].grad
        if want is None:
            assert param.grad is None or torch.count_nonzero(param.grad) == 0, name
            continue
        # fp32 rounding, relative to the tensor's scale (some gradients are exactly zero in theory)
        torch.testing.assert_close(param.grad, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()) + 1e-9,
                                   msg=name)


def test_under_bf16_autocast_the_head_runs_in_bf16_like_autograd() -> None:
    """Lightning's bf16-mixed: fp32 parameters and inputs, the head's GEMM in bf16 under autocast."""
    x, weight, b, targets, row_weight = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(x, weight, b).float()
    ce_ref = F.cross_entropy(logits, targets, reduction="none")
    (ce_ref * row_weight).sum().backward()
    ref = [t.grad.clone() for t in (x, weight, b)]
    x.grad = weight.grad = b.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, weight, b, targets, row_weight, chunk_rows=3)
    loss.total.backward()
    torch.testing.assert_close(loss.per_row, ce_ref)  # the same bf16 logits
    for got, want in zip((x.grad, weight.grad, b.grad), ref, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
