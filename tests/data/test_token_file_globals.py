"""What a token file's pickle may ask for (`lumina.tokenizers.token_files`): torch's weights_only allow-list (the
official files hold torch tensors in a dict; an `OrderedDict` is one of torch's plain containers) plus the NumPy
globals of `NUMPY_GLOBALS`; anything else is refused naming the file and the globals."""

from __future__ import annotations

from collections import OrderedDict, defaultdict

import numpy as np
import pytest
import torch

from lumina.tokenizers.token_files import TokenFileError, read_token_file

# a 1 x 2 image: coords (batch, time, row, col), 8 codebooks of codes < 4096 (AToken's sizes)
COORDS = [[0, 0, 0, 0], [0, 0, 0, 1]]
CODES = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]


@pytest.mark.parametrize("container", [dict, OrderedDict], ids=["dict", "OrderedDict"])
@pytest.mark.parametrize("array", [torch.tensor, np.array], ids=["torch", "numpy"])
def test_torch_containers_and_numpy_arrays_load(container, array, tmp_path):
    path = tmp_path / "t.pt"
    torch.save(container(indices=array(CODES), coords=array(COORDS)), path)
    token_file = read_token_file(path, "image")
    assert tuple(token_file.grid) == (1, 2)
    assert token_file.codes.tolist() == CODES


def test_a_container_outside_the_allow_lists_is_refused_naming_it(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"indices": torch.tensor(CODES), "coords": torch.tensor(COORDS), "extra": defaultdict(int)}, path)
    with pytest.raises(TokenFileError, match=r"t\.pt.*collections\.defaultdict"):
        read_token_file(path, "image")
