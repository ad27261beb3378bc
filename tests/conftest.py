"""Suite-wide fixtures."""

from pathlib import Path

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


STANDIN = Path(__file__).parent / "atoken_standin"


def write_atoken_standin(directory: Path) -> dict[str, str]:
    """A config and checkpoint for the stand-in `atoken_inference` package (tests/atoken_standin) in
    `directory`: {"config", "checkpoint", "package"}."""
    config, checkpoint = directory / "atoken-standin.yaml", directory / "atoken-standin.pt"
    config.write_text("model:\n  model_cfg:\n    arch_cfg:\n      patch_size: [4, 16, 16]\n      use_quantizer: true\n")
    torch.save({"levels": torch.linspace(-1, 1, 4096)}, checkpoint)
    return {"config": str(config), "checkpoint": str(checkpoint), "package": str(STANDIN)}


@pytest.fixture
def atoken_files(tmp_path, monkeypatch) -> dict[str, str]:
    """`write_atoken_standin` in tmp_path, also exported as ATOKEN_CONFIG_PATH / ATOKEN_MODEL_PATH."""
    files = write_atoken_standin(tmp_path)
    monkeypatch.setenv("ATOKEN_CONFIG_PATH", files["config"])
    monkeypatch.setenv("ATOKEN_MODEL_PATH", files["checkpoint"])
    return files


@pytest.fixture(scope="module")
def atoken_module_files(tmp_path_factory) -> dict[str, str]:
    """`write_atoken_standin` for a whole module (the paths passed explicitly, no environment)."""
    return write_atoken_standin(tmp_path_factory.mktemp("atoken"))


@pytest.fixture
def attend_calls():
    """A Counter of the `attend` calls made while the test runs, read through the attend hook: the backend that
    served each call, and "fallback:<asked>-><served>" for each fallback. `.clear()` it to start over."""
    from collections import Counter

    from lumina.attention import register_attend_hook

    calls: Counter[str] = Counter()

    def record(call) -> None:
        if call.fallback_reason is not None:
            calls[f"fallback:{call.requested}->{call.served}"] += 1
        calls[call.served] += 1

    handle = register_attend_hook(record)
    yield calls
    handle.remove()
