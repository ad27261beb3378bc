"""Own-data evaluation: which task a held-out sample is, from its structure alone."""

from __future__ import annotations

import pytest
import torch

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.tasks import task_of
from lumina.generation.own_eval import held_out_dataset

IMAGE = Media("image", torch.zeros(4, 2, dtype=torch.long), (2, 2))


def sample(*turns: tuple[str, list]) -> Sample:
    return Sample("s", [Turn(role, parts) for role, parts in turns])


@pytest.mark.parametrize(("turns", "task"), [
    ((("user", [IMAGE, Text([1])]), ("assistant", [Text([2])])), "understand"),
    ((("system", [Text([9])]), ("user", [Text([1])]), ("assistant", [Text([2])])), "text"),
    ((("user", [Text([1])]), ("assistant", [IMAGE])), "t2i"),
    ((("user", [IMAGE, Text([1])]), ("assistant", [IMAGE])), "edit"),
    ((("user", [Text([1])]), ("assistant", [Text([2])]), ("user", [Text([3])]), ("assistant", [Text([4])])), None),
])
def test_task_of_a_sample(turns, task):
    assert task_of(sample(*turns)) == task


def test_a_root_without_a_held_out_split_is_refused(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(ValueError, match=r"eval.data=.*: a dataset root without val/ or validation/"):
        held_out_dataset(tmp_path, assets=None)
