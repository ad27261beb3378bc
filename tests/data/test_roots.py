"""Dataset roots: train/ + val/ (or Hugging Face's validation/) read as the splits of a data source."""

from __future__ import annotations

import pytest

from lumina.data.roots import dataset_root
from lumina.training.data_factory import root_splits
from lumina.training.errors import ConfigError


def test_train_and_val_or_validation(tmp_path):
    (tmp_path / "a" / "train").mkdir(parents=True)
    (tmp_path / "a" / "val").mkdir()
    (tmp_path / "b" / "train").mkdir(parents=True)
    (tmp_path / "b" / "validation").mkdir()
    (tmp_path / "c" / "train").mkdir(parents=True)
    assert dataset_root(tmp_path / "a").val == tmp_path / "a" / "val"
    assert dataset_root(tmp_path / "b").val == tmp_path / "b" / "validation"
    root = dataset_root(tmp_path / "c")
    assert (root.train, root.val) == (tmp_path / "c" / "train", None)
    assert dataset_root(tmp_path / "c" / "train") is None  # shards themselves: read as they are


def test_two_held_out_folders_are_ambiguous(tmp_path):
    for name in ("train", "val", "validation"):
        (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match=r"holds both val/ and validation/"):
        dataset_root(tmp_path)
    with pytest.raises(ConfigError, match=r"data.sources\[2\].path: .*holds both val/ and validation/"):
        root_splits(str(tmp_path), {}, 2)


def test_a_source_path_that_is_a_root_gives_train_and_val_path(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    assert root_splits(str(tmp_path), {}, 0) == (str(tmp_path / "train"), {"val_path": str(tmp_path / "val")})
    assert root_splits(str(tmp_path / "train"), {"val_path": "x"}, 0) == (str(tmp_path / "train"), {"val_path": "x"})
    with pytest.raises(ConfigError, match=r"data.sources\[0\].path=.* is a dataset root .*drop options.val_path='x'"):
        root_splits(str(tmp_path), {"val_path": "x"}, 0)
