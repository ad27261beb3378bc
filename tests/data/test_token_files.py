"""Official token files: NumPy payloads load, foreign pickles are refused unrun, every schema error names its
field, and coords map to grids with the official conventions (utils/media_token_io.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sample_helpers import Shell

from lumina.tokenizers.token_files import TokenFileError, read_token_file, token_file_dict


def image_rows(h: int, w: int, columns: int = 5) -> list[list[int]]:
    return [[0, 0, r, c, 0][:columns] for r in range(h) for c in range(w)]


def cell_codes(values: list[int], columns: int = 8) -> np.ndarray:
    """[N, columns] int32, every column of row i = values[i]."""
    return np.repeat(np.asarray(values, dtype=np.int32)[:, None], columns, axis=1)


def test_numpy_arrays_and_sizes_load(tmp_path):
    # as a NumPy-based official writer leaves them: arrays for indices/coords, NumPy scalars for the size
    torch.save({"indices": cell_codes([5, 6, 7, 8, 9, 10]), "coords": np.asarray(image_rows(2, 3), np.int64),
                "image_width": np.int64(48), "image_height": np.int64(32)}, tmp_path / "a.pkl")
    found = read_token_file(tmp_path / "a.pkl", "image")
    assert found.grid == (2, 3) and found.image_size == (32, 48)
    assert found.codes.dtype == torch.int64 and found.codes[:, 3].tolist() == [5, 6, 7, 8, 9, 10]


def test_a_pickle_calling_os_system_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pkl"
    torch.save({"indices": Shell(f"touch {marker}"), "coords": image_rows(1, 1)}, path)
    torch.load(path, weights_only=False)  # the payload is live: plain unpickling runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(TokenFileError, match=r"token file .*evil.pkl cannot be read safely.*system"):
        read_token_file(path, "image")
    assert not marker.exists()


GOOD = {"indices": cell_codes([1, 2]), "coords": image_rows(1, 2)}


@pytest.mark.parametrize(("payload", "kind", "pattern"), [
    ([1, 2], "image", r"the payload must be a dict, got list"),
    ({"indices": GOOD["indices"]}, "image", r"missing key\(s\) \['coords'\]"),
    ({**GOOD, "indices": np.arange(16)}, "image", r"image indices must be 2-D, got shape \[16\]"),
    ({**GOOD, "indices": torch.zeros(0, 8, dtype=torch.int32)}, "image", r"image indices must hold at least one row"),
    ({**GOOD, "indices": cell_codes([1, 2], 4)}, "image", r"image indices must have 8 columns, got shape \[2, 4\]"),
    ({**GOOD, "indices": np.ones((2, 8), np.float32)}, "image", r"image indices must have an integer dtype"),
    ({**GOOD, "indices": cell_codes([1, 4096])}, "image", r"indices must lie in \[0, 4096\), got min=1, max=4096"),
    ({**GOOD, "indices": cell_codes([-1, 2])}, "image", r"indices must lie in \[0, 4096\), got min=-1"),
    ({**GOOD, "coords": [[0, 1, 2], [0, 1, 3]]}, "image", r"image coords must have 4 or 5 columns, got shape \[2, 3\]"),
    ({**GOOD, "coords": [[0, 0, 0, 0], [0, 0, 1, 0]]}, "video", r"video coords must have 5 columns"),
    ({**GOOD, "coords": [[0, 0, 0, 0]] * 2}, "mesh3d", r"mesh3d coords must have 3 or 5 columns"),
    ({**GOOD, "coords": image_rows(1, 3)}, "image", r"image indices has 2 rows, coords has 3; they must match"),
    ({**GOOD, "coords": [[0, 0, 0, -1, 0], [0, 0, 0, 0, 0]]}, "image", r"image coords must be non-negative, got min=-1"),
    ({**GOOD, "coords": [[0, 0, 0, 0, 0], [1, 0, 0, 1, 0]]}, "image", r"coords column 0 varies"),
    ({**GOOD, "coords": [[0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]}, "image", r"not in row-major order"),
    ({**GOOD, "image_width": 32}, "image", r"image_width given without \{'image_height'\}"),
    ({**GOOD, "image_width": 32, "image_height": 0}, "image", r"image_height=0 must be a positive integer"),
])
def test_each_schema_error_names_the_file_and_field(tmp_path, payload, kind, pattern):
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(TokenFileError, match=rf"token file .*bad.pt: .*{pattern}"):
        read_token_file(tmp_path / "bad.pt", kind)


def test_image_coords_column_2_is_the_row_and_3_the_column(tmp_path):
    # a 2 x 3 grid: rows (column 2) 0..1, columns (column 3) 0..2; 4-column coords read the same
    for columns in (4, 5):
        torch.save({"indices": cell_codes([0, 1, 2, 10, 11, 12]), "coords": image_rows(2, 3, columns)},
                   tmp_path / "img.pt")
        found = read_token_file(tmp_path / "img.pt", "image")
        assert found.grid == (2, 3) and found.codes[:, 0].tolist() == [0, 1, 2, 10, 11, 12]


def test_video_coords_are_batch_t_x_y_with_x_the_width_and_are_sorted_t_y_x(tmp_path):
    # 2 frame groups of a 2-row x 3-column grid, listed x-major (as an encoder may emit them); code = 100t+10y+x
    cells = [(t, x, y) for x in range(3) for t in range(2) for y in range(2)]
    torch.save({"indices": cell_codes([100 * t + 10 * y + x for t, x, y in cells]),
                "coords": [[0, t, x, y, 0] for t, x, y in cells]}, tmp_path / "vid.pkl")
    found = read_token_file(tmp_path / "vid.pkl", "video")
    assert found.grid == (2, 2, 3)
    assert found.codes[:, 0].tolist() == [100 * t + 10 * y + x for t in range(2) for y in range(2) for x in range(3)]


def test_video_with_a_repeated_cell_is_refused(tmp_path):
    coords = [[0, 0, x, 0, 0] for x in range(3)] + [[0, 0, 1, 1, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 0]]
    torch.save({"indices": cell_codes(list(range(6))), "coords": coords}, tmp_path / "v.pt")
    with pytest.raises(TokenFileError, match=r"v.pt: coords do not cover the grid \(1, 2, 3\) exactly once"):
        read_token_file(tmp_path / "v.pt", "video")


def test_mesh_coords_three_or_five_columns(tmp_path):
    cells = [(x, y, z) for x in range(2) for y in range(3) for z in range(2)]
    values = [100 * z + 10 * y + x for x, y, z in cells]
    expected = [100 * z + 10 * y + x for z in range(2) for y in range(3) for x in range(2)]
    for coords in ([list(c) for c in cells], [[0, 0, *c] for c in cells]):
        torch.save({"indices": cell_codes(values), "coords": coords}, tmp_path / "m.pt")
        found = read_token_file(tmp_path / "m.pt", "mesh3d")
        assert found.grid == (2, 3, 2) and found.codes[:, 0].tolist() == expected


def test_code_range_and_columns_come_from_the_tokenizer(tmp_path):
    torch.save({"indices": cell_codes([0, 63], 4), "coords": image_rows(1, 2)}, tmp_path / "own.pt")
    assert read_token_file(tmp_path / "own.pt", "image", num_codebooks=4, codebook_size=64).grid == (1, 2)
    torch.save({"indices": cell_codes([0, 64], 4), "coords": image_rows(1, 2)}, tmp_path / "own.pt")
    with pytest.raises(TokenFileError, match=r"indices must lie in \[0, 64\), got min=0, max=64"):
        read_token_file(tmp_path / "own.pt", "image", num_codebooks=4, codebook_size=64)


def test_written_files_carry_the_official_keys_and_read_back(tmp_path: Path):
    codes = torch.tensor(cell_codes(list(range(6)), 4), dtype=torch.int64)
    torch.save(token_file_dict(codes, (3, 2), image_size=(12, 8)), tmp_path / "w.pkl")
    raw = torch.load(tmp_path / "w.pkl", weights_only=True)
    assert sorted(raw) == ["coords", "image_height", "image_width", "indices"]
    assert raw["indices"].dtype == raw["coords"].dtype == torch.int32
    assert raw["coords"].tolist() == image_rows(3, 2) and (raw["image_height"], raw["image_width"]) == (12, 8)
    found = read_token_file(tmp_path / "w.pkl", "image", num_codebooks=4, codebook_size=64)
    assert torch.equal(found.codes, codes) and found.grid == (3, 2) and found.image_size == (12, 8)
