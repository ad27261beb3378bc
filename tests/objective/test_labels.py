"""Labels: the batch's one shape normalisation per accepted shape, the model's one value check
(`check_labels`) and every label error, and the objective's inverse_t check at the supervised text rows."""

from __future__ import annotations

import pytest
import torch
from objective_helpers import make_batch

from lumina.model.supervision import check_labels
from lumina.objective import check_inverse_t_rows

M = -100


def normalised(labels: torch.Tensor, seq_len: int, cols: int) -> torch.Tensor:
    """labels as `PackedBatch` normalises them for a pack of seq_len rows and `cols` id columns."""
    return make_batch([3] * seq_len, labels, num_cols=cols).labels


def test_sc_labels_gain_a_batch_dim() -> None:
    out = normalised(torch.arange(10).view(5, 2), 5, 2)
    assert out.shape == (1, 5, 2) and out.dtype == torch.int64
    assert out[0, 3].tolist() == [6, 7]


def test_bsc_labels_kept() -> None:
    labels = torch.arange(3 * 4).view(1, 3, 4)
    assert torch.equal(normalised(labels, 3, 4), labels)


def test_legacy_bs_labels_fill_column_zero_and_ignore_the_rest() -> None:
    out = normalised(torch.tensor([[5, M, 7]]), 3, 4)
    assert out.shape == (1, 3, 4)
    assert out[..., 0].tolist() == [[5, M, 7]]
    assert (out[..., 1:] == M).all()
    assert normalised(torch.tensor([5, M, 7]), 3, 4)[..., 0].tolist() == [[5, M, 7]]


def test_one_column_3d_labels_are_legacy() -> None:
    out = normalised(torch.tensor([[[3], [M]]]), 2, 3)
    assert out.tolist() == [[[3, M, M], [M, M, M]]]


def test_2d_shape_resolved_against_the_rows_not_last_dim() -> None:
    # S = C = 8: an [8, 8] label is [S, C], a [1, 8] label is legacy [1, S]
    square = torch.arange(64).view(8, 8)
    assert torch.equal(normalised(square, 8, 8)[0], square)
    row = torch.arange(8).view(1, 8)
    out = normalised(row, 8, 8)
    assert out[0, :, 0].tolist() == list(range(8)) and (out[0, :, 1:] == M).all()


def test_int32_widened_and_integral_float32_accepted() -> None:
    out = normalised(torch.tensor([[4, M]], dtype=torch.int32), 2, 1)
    assert out.dtype == torch.int64 and out.view(-1).tolist() == [4, M]
    out = normalised(torch.tensor([[4.0, -100.0]]), 2, 1)
    assert out.dtype == torch.int64 and out.view(-1).tolist() == [4, M]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_labels_raise(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="labels.*dtype"):
        normalised(torch.zeros(1, 2, dtype=dtype), 2, 1)


def test_float32_non_integral_or_too_large_raise() -> None:
    with pytest.raises(ValueError, match="labels.*non-integral"):
        normalised(torch.tensor([[1.5, 2.0]]), 2, 1)
    with pytest.raises(ValueError, match="labels.*2\\^24"):
        normalised(torch.tensor([[float(2**24), 2.0]]), 2, 1)


@pytest.mark.parametrize("shape,why", [
    ((2, 3), "disagree in length.*labels 2"),                                 # neither [1, S] nor [S, C]
    ((1, 3, 3), "labels has 3 columns, input_ids has 2"),                     # C mismatch
    ((1, 4, 2), "disagree in length.*labels 4"),                               # S mismatch
    ((2, 3, 2), r"labels has shape \[2, 3, 2\]; expected \[1, S, C\]"),         # B = 2
    ((4,), "disagree in length.*labels 4"),                                    # 1-D, S mismatch
    ((3, 2, 2, 1), r"labels has shape \[3, 2, 2, 1\]; expected \[1, S, C\]"),     # 4-D
])
def test_bad_shapes_raise(shape: tuple[int, ...], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        normalised(torch.zeros(shape, dtype=torch.long), 3, 2)


# ---- the one value check ----

TYPES = [1, 3, 3, 4, 4, 2]


def good_labels() -> torch.Tensor:
    return torch.tensor([[[M, M], [7, M], [M, M], [1, 2], [M, M], [M, M]]])


def check(labels: torch.Tensor, valid: list[bool] | None = None, num_codebooks: int = 2,
          num_cols: int = 2) -> tuple[list[int], list[int]]:
    batch = make_batch(TYPES, labels, num_cols=num_cols, token_valid=valid)
    text, image = check_labels(batch, vocab_size=10, codebook_size=4, num_codebooks=num_codebooks)
    return text.tolist(), image.tolist()


def test_consistent_labels_pass_and_give_the_supervised_rows() -> None:
    assert check(good_labels()) == ([1], [3])


def test_label_on_other_type_raises_naming_the_row() -> None:
    labels = good_labels()
    labels[0, 5, 1] = 3  # type-2 row
    with pytest.raises(ValueError, match=r"labels row 5 .*type 2\) = \[-100, 3\]: only type-3"):
        check(labels)
    labels = good_labels()
    labels[0, 0, 0] = 3  # type-1 row
    with pytest.raises(ValueError, match="row 0 .*type 1"):
        check(labels)


def test_text_row_labelled_outside_column_zero_raises() -> None:
    labels = good_labels()
    labels[0, 2, 1] = 5  # type-3 row 2: column 0 stays -100, column 1 labelled
    with pytest.raises(ValueError, match="row 2 .*type 3.*column 0"):
        check(labels)
    labels = good_labels()
    labels[0, 1, 1] = 5  # a supervised text row may repeat its target in the other columns
    check(labels)


def test_partially_labelled_image_row_raises() -> None:
    labels = good_labels()
    labels[0, 4, 0] = 1  # second column stays -100
    with pytest.raises(ValueError, match=r"row 4 .*\[1, -100\].*codebook_size=4.*must be non-negative"):
        check(labels)


@pytest.mark.parametrize("code", [4, -3])
def test_image_code_outside_codebook_raises(code: int) -> None:
    labels = good_labels()
    labels[0, 3, 1] = code
    with pytest.raises(ValueError, match=rf"row 3 .*\[1, {code}\].*codebook_size=4"):
        check(labels)


@pytest.mark.parametrize("target", [10, -1])
def test_text_target_outside_vocab_raises(target: int) -> None:
    labels = good_labels()
    labels[0, 1, 0] = target
    with pytest.raises(ValueError, match=rf"row 1 .*\[{target}, -100\].*vocab_size=10"):
        check(labels)


def test_label_on_invalid_token_raises() -> None:
    with pytest.raises(ValueError, match="row 3 .*token_valid"):
        check(good_labels(), valid=[True, True, True, False, True, True])


def test_image_label_with_too_few_columns_raises() -> None:
    labels = torch.tensor([[M, 7, M, 1, M, M]])  # one column: legacy text-only labels, an image row labelled
    with pytest.raises(ValueError, match=r"row 3 .*\[1\].*num_codebooks=2 label columns"):
        check(labels, num_cols=1)
    assert check(torch.tensor([[M, 7, M, M, M, M]]), num_cols=1) == ([1], [])


# ---- the objective's own check for inverse_t ----

def test_inverse_t_needs_positive_noise_and_answer_mask() -> None:
    rows = torch.tensor([1])
    answer = torch.tensor([[False, True, True, False, False, False]])
    check_inverse_t_rows(rows, torch.tensor([[0, 0.5, 0.5, 0, 0, 0]]), answer)
    with pytest.raises(ValueError, match=r"noise_t row 1 = 0.0: .*noise_t > 0"):
        check_inverse_t_rows(rows, torch.zeros(1, 6), answer)
    with pytest.raises(ValueError, match="answer_mask row 1 is false"):
        check_inverse_t_rows(rows, torch.full((1, 6), 0.5), torch.zeros(1, 6, dtype=torch.bool))
