"""Label normalisation per accepted shape, and every label error."""

from __future__ import annotations

import pytest
import torch

from lumina.objective import normalize_labels, validate_supervision

M = -100


def ids(batch: int, seq_len: int, cols: int) -> torch.Tensor:
    return torch.zeros(batch, seq_len, cols, dtype=torch.long)


def test_sc_labels_gain_a_batch_dim() -> None:
    labels = torch.arange(10).view(5, 2)
    out = normalize_labels(labels, ids(1, 5, 2))
    assert out.shape == (1, 5, 2) and out.dtype == torch.int64
    assert out[0, 3].tolist() == [6, 7]


def test_bsc_labels_kept() -> None:
    labels = torch.arange(2 * 3 * 4).view(2, 3, 4)
    out = normalize_labels(labels, ids(2, 3, 4))
    assert torch.equal(out, labels)


def test_legacy_bs_labels_fill_column_zero_and_ignore_the_rest() -> None:
    labels = torch.tensor([[5, M, 7], [1, 2, M]])
    out = normalize_labels(labels, ids(2, 3, 4))
    assert out.shape == (2, 3, 4)
    assert out[..., 0].tolist() == [[5, M, 7], [1, 2, M]]
    assert (out[..., 1:] == M).all()


def test_one_column_3d_labels_are_legacy() -> None:
    out = normalize_labels(torch.tensor([[[3], [M]]]), ids(1, 2, 3))
    assert out.tolist() == [[[3, M, M], [M, M, M]]]


def test_2d_shape_resolved_against_input_ids_not_last_dim() -> None:
    # S = C = 8: an [8, 8] label is [S, C] (B = 1), a [1, 8] label is legacy [B, S]
    square = torch.arange(64).view(8, 8)
    assert torch.equal(normalize_labels(square, ids(1, 8, 8))[0], square)
    row = torch.arange(8).view(1, 8)
    out = normalize_labels(row, ids(1, 8, 8))
    assert out[0, :, 0].tolist() == list(range(8)) and (out[0, :, 1:] == M).all()
    # S = 1, C = 8: [1, 8] is [S, C], since [B, S] would be [1, 1]
    one = torch.arange(8).view(1, 8)
    assert normalize_labels(one, ids(1, 1, 8)).tolist() == [[list(range(8))]]


def test_int32_widened_and_integral_float32_accepted() -> None:
    out = normalize_labels(torch.tensor([[4, M]], dtype=torch.int32), ids(1, 2, 1))
    assert out.dtype == torch.int64 and out.view(-1).tolist() == [4, M]
    out = normalize_labels(torch.tensor([[4.0, -100.0]]), ids(1, 2, 1))
    assert out.dtype == torch.int64 and out.view(-1).tolist() == [4, M]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_labels_raise(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="labels.*dtype"):
        normalize_labels(torch.zeros(1, 2, dtype=dtype), ids(1, 2, 1))


def test_float32_non_integral_or_too_large_raise() -> None:
    with pytest.raises(ValueError, match="labels.*non-integral"):
        normalize_labels(torch.tensor([[1.5, 2.0]]), ids(1, 2, 1))
    with pytest.raises(ValueError, match="labels.*2\\^24"):
        normalize_labels(torch.tensor([[float(2**24), 2.0]]), ids(1, 2, 1))


@pytest.mark.parametrize("shape,why", [
    ((3, 2), "2-D label"),          # [S, C] with B = 2
    ((2, 4), "2-D label"),          # neither [B, S] nor [S, C]
    ((2, 3, 3), "columns"),         # C mismatch
    ((2, 4, 2), "expected"),        # S mismatch
    ((3,), "expected"),             # 1-D
])
def test_bad_shapes_raise(shape: tuple[int, ...], why: str) -> None:
    with pytest.raises(ValueError, match=f"labels.*{why}|{why}.*labels|labels has"):
        normalize_labels(torch.zeros(shape, dtype=torch.long), ids(2, 3, 2))


# ---- validation against row types and the output's rows ----

TYPES = torch.tensor([[1, 3, 3, 4, 4, 2]])


def good_labels() -> torch.Tensor:
    return torch.tensor([[[M, M], [7, M], [M, M], [1, 2], [M, M], [M, M]]])


def check(labels: torch.Tensor, text_rows: list[int] = (1,), image_rows: list[int] = (3,), valid=None, **kw) -> None:
    token_valid = torch.ones(1, 6, dtype=torch.bool) if valid is None else torch.tensor([valid])
    validate_supervision(labels, TYPES, token_valid, torch.tensor(text_rows, dtype=torch.long),
                         torch.tensor(image_rows, dtype=torch.long), vocab_size=10, codebook_size=4, **kw)


def test_consistent_labels_pass() -> None:
    check(good_labels())


def test_label_on_other_type_raises_naming_the_row() -> None:
    labels = good_labels()
    labels[0, 5, 1] = 3  # type-2 row
    with pytest.raises(ValueError, match="row 5 .*type 2"):
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
    with pytest.raises(ValueError, match="row 4 .*codebook_size=4.*must be non-negative"):
        check(labels, image_rows=[3, 4])


@pytest.mark.parametrize("code", [4, -3])
def test_image_code_outside_codebook_raises(code: int) -> None:
    labels = good_labels()
    labels[0, 3, 1] = code
    with pytest.raises(ValueError, match="row 3 .*codebook_size=4"):
        check(labels)


@pytest.mark.parametrize("target", [10, -1])
def test_text_target_outside_vocab_raises(target: int) -> None:
    labels = good_labels()
    labels[0, 1, 0] = target
    with pytest.raises(ValueError, match="row 1 .*vocab_size=10"):
        check(labels)


def test_label_on_invalid_token_raises() -> None:
    with pytest.raises(ValueError, match="row 3 .*token_valid"):
        check(good_labels(), valid=[True, True, True, False, True, True])


def test_rows_disagreeing_with_labels_raise() -> None:
    with pytest.raises(ValueError, match="text_rows has 2 rows"):
        check(good_labels(), text_rows=[1, 2])
    with pytest.raises(ValueError, match="rows disagree"):
        check(good_labels(), text_rows=[2])  # right count, wrong row
    with pytest.raises(ValueError, match="image_rows has 0 rows"):
        check(good_labels(), image_rows=[])


def test_inverse_t_needs_positive_noise_and_answer_mask() -> None:
    answer = torch.tensor([[False, True, True, False, False, False]])
    check(good_labels(), noise_t=torch.tensor([[0, 0.5, 0.5, 0, 0, 0]]), answer_mask=answer)
    with pytest.raises(ValueError, match="row 1 .*noise_t > 0"):
        check(good_labels(), noise_t=torch.zeros(1, 6), answer_mask=answer)
    with pytest.raises(ValueError, match="row 1 .*answer_mask"):
        check(good_labels(), noise_t=torch.full((1, 6), 0.5), answer_mask=torch.zeros(1, 6, dtype=torch.bool))
