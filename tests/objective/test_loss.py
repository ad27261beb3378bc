"""Loss values against hand-computed cases (explicit log-sum-exp arithmetic on tiny logits)."""

from __future__ import annotations

import math

import pytest
import torch
from objective_helpers import HandOutput, logit_grads, make_batch

from lumina.model import LuminaOutput
from lumina.objective import LuminaObjective, ObjectiveConfig

M = -100
TYPES = [1, 3, 3, 3, 4, 4, 0]
TEXT_LOGITS = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]  # rows 1 and 3, V = 3
IMAGE_LOGITS = [[[0.2, 0.1, -0.3], [1.0, 1.0, 0.0]],  # row 4, C = 2 codebooks, K = 3 classes
                [[2.0, 0.0, 0.0], [-1.0, 0.5, 0.25]]]  # row 5
LABELS = [[M, M], [2, M], [M, M], [0, M], [1, 0], [2, 2], [M, M]]


def nll(logits: list[float], target: int) -> float:
    """-log softmax(logits)[target], written out."""
    return math.log(sum(math.exp(z) for z in logits)) - logits[target]


def output(requires_grad: bool = True) -> LuminaOutput:
    return HandOutput(text_logits=torch.tensor(TEXT_LOGITS, requires_grad=requires_grad),
                      text_rows=torch.tensor([1, 3]),
                      image_logits=torch.tensor(IMAGE_LOGITS, requires_grad=requires_grad),
                      image_rows=torch.tensor([4, 5]))


def batch(**kw):
    return make_batch(TYPES, torch.tensor([LABELS]), **kw)


CE_TEXT = [nll(TEXT_LOGITS[0], 2), nll(TEXT_LOGITS[1], 0)]
CE_IMG = [[nll(IMAGE_LOGITS[0][0], 1), nll(IMAGE_LOGITS[0][1], 0)],
          [nll(IMAGE_LOGITS[1][0], 2), nll(IMAGE_LOGITS[1][1], 2)]]


def test_unweighted_text_and_image_loss() -> None:
    objective = LuminaObjective(ObjectiveConfig(text_weight=0.7, image_weight=1.3))
    result = objective(output(), batch())
    text = (CE_TEXT[0] + CE_TEXT[1]) / 2
    image = ((CE_IMG[0][0] + CE_IMG[0][1]) / 2 + (CE_IMG[1][0] + CE_IMG[1][1]) / 2) / 2
    assert result.text_loss.item() == pytest.approx(text, rel=1e-6)
    assert result.image_loss.item() == pytest.approx(image, rel=1e-6)
    assert result.loss.item() == pytest.approx(0.7 * text + 1.3 * image, rel=1e-6)
    per_codebook = [(CE_IMG[0][c] + CE_IMG[1][c]) / 2 for c in range(2)]
    assert result.image_loss_per_codebook.tolist() == pytest.approx(per_codebook, rel=1e-6)
    assert result.balance_loss.item() == 0.0
    assert (result.num_text_local.item(), result.num_text_global.item()) == (2, 2)
    assert (result.num_image_local.item(), result.num_image_global.item()) == (2, 2)
    assert result.text_preds.tolist() == [1, 2] and result.text_targets.tolist() == [2, 0]
    assert result.image_preds.tolist() == [[0, 0], [0, 1]] and result.image_targets.tolist() == [[1, 0], [2, 2]]
    assert not result.image_loss_per_codebook.requires_grad and not result.text_loss.requires_grad


def test_inverse_t_weights_by_one_over_t_and_counts_answer_tokens() -> None:
    # answer tokens: rows 1-3 (row 2 unmasked, label -100); t = 0.5 at row 1, 0.25 at row 3
    noise = [0.0, 0.5, 0.5, 0.25, 0.0, 0.0, 0.0]
    answer = [False, True, True, True, False, False, False]
    objective = LuminaObjective(ObjectiveConfig(text_weighting="inverse_t", image_weight=0.0))
    result = objective(output(), batch(noise_t=noise, answer_mask=answer))
    text = (CE_TEXT[0] / 0.5 + CE_TEXT[1] / 0.25) / 3
    assert result.text_loss.item() == pytest.approx(text, rel=1e-6)
    assert result.loss.item() == pytest.approx(text, rel=1e-6)
    assert result.num_text_local.item() == 3


def test_inverse_t_does_not_count_image_answer_tokens() -> None:
    noise = [0.0, 0.5, 0.5, 0.25, 0.3, 0.3, 0.0]
    answer = [False, True, True, True, True, True, False]
    objective = LuminaObjective(ObjectiveConfig(text_weighting="inverse_t"))
    result = objective(output(), batch(noise_t=noise, answer_mask=answer))
    assert result.num_text_local.item() == 3
    assert result.text_loss.item() == pytest.approx((CE_TEXT[0] / 0.5 + CE_TEXT[1] / 0.25) / 3, rel=1e-6)


def test_gradient_of_text_term_is_softmax_minus_onehot_over_n() -> None:
    out = output()
    LuminaObjective(ObjectiveConfig(image_weight=0.0))(out, batch()).loss.backward()
    for row, target in ((0, 2), (1, 0)):
        z = TEXT_LOGITS[row]
        total = sum(math.exp(v) for v in z)
        expected = [(math.exp(v) / total - (j == target)) / 2 for j, v in enumerate(z)]
        assert logit_grads(out)[0][row].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_missing_modality_gives_a_connected_exact_zero() -> None:
    labels = torch.tensor([[[M, M], [2, M], [M, M], [0, M], [M, M], [M, M], [M, M]]])
    image_logits = torch.zeros(0, 2, 3, requires_grad=True)
    text_logits = torch.tensor(TEXT_LOGITS, requires_grad=True)
    out = HandOutput(text_logits=text_logits, text_rows=torch.tensor([1, 3]), image_logits=image_logits,
                     image_rows=torch.zeros(0, dtype=torch.long))
    result = LuminaObjective()(out, make_batch(TYPES, labels))
    assert result.image_loss.item() == 0.0 and result.num_image_global.item() == 0
    assert result.image_loss_per_codebook.tolist() == [0.0, 0.0]
    assert result.loss.item() == pytest.approx((CE_TEXT[0] + CE_TEXT[1]) / 2, rel=1e-6)
    result.loss.backward()
    assert logit_grads(out)[1].shape == (0, 2, 3)


def test_no_supervision_at_all_is_zero_with_grad_fn() -> None:
    labels = torch.full((1, 7, 2), M)
    text_logits = torch.zeros(0, 3, requires_grad=True)
    image_logits = torch.zeros(0, 2, 3, requires_grad=True)
    out = HandOutput(text_logits=text_logits, text_rows=torch.zeros(0, dtype=torch.long),
                     image_logits=image_logits, image_rows=torch.zeros(0, dtype=torch.long))
    result = LuminaObjective()(out, make_batch(TYPES, labels))
    assert result.loss.item() == 0.0 and not torch.isnan(result.loss)
    assert result.loss.grad_fn is not None
    result.loss.backward()
    text_grad, image_grad = logit_grads(out)
    assert text_grad.shape == (0, 3) and image_grad.shape == (0, 2, 3)


def test_objective_without_labels_raises() -> None:
    # label values are checked once, by the model's forward (tests/model/test_forward.py)
    with pytest.raises(ValueError, match="labels is None"):
        LuminaObjective()(output(), make_batch(TYPES, None))


def test_bf16_logits_are_upcast() -> None:
    out = HandOutput(text_logits=torch.tensor(TEXT_LOGITS).bfloat16(), text_rows=torch.tensor([1, 3]),
                     image_logits=torch.tensor(IMAGE_LOGITS).bfloat16(), image_rows=torch.tensor([4, 5]))
    result = LuminaObjective()(out, batch())
    z = [[float(v) for v in torch.tensor(row).bfloat16()] for row in TEXT_LOGITS]
    assert result.text_loss.dtype == torch.float32
    assert result.text_loss.item() == pytest.approx((nll(z[0], 2) + nll(z[1], 0)) / 2, rel=1e-6)
