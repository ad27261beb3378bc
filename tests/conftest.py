"""Suite-wide fixtures."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tests run many tiny tensor ops; on a small, shared CPU one intra-op thread avoids OpenMP barrier stalls
    (10-100x faster here). Session-wide, so module fixtures are built under it too; restored at the end."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
