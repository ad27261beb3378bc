"""`lumina.parts.Registry`: a part is found by its name once its module sits in the kind's package (no list of
names edited), by a dotted path from the user's own package, and a bad name is refused naming the field."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from lumina.parts import Registry


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real package `toyparts` on sys.path holding the registry in `toyparts/registry.py`."""
    root = tmp_path / "toyparts"
    (root / "kinds").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "kinds" / "__init__.py").write_text("")
    (root / "registry.py").write_text("from lumina.parts import Registry\nTOYS = Registry('toy', 'toyparts.kinds')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m == "toyparts" or m.startswith("toyparts.")]:
        del sys.modules[name]


def _part(root: Path, module: str, name: str, cls: str, official: bool = False) -> None:
    (root / "kinds" / f"{module}.py").write_text(textwrap.dedent(f"""
        from toyparts.registry import TOYS

        @TOYS.register({name!r}, official={official})
        class {cls}:
            def __init__(self, x=0):
                self.x = x
    """))


def test_a_new_module_in_the_package_is_found_by_name(package: Path) -> None:
    _part(package, "plain", "plain", "Plain", official=True)
    _part(package, "fancy", "fancy", "Fancy")
    from toyparts.registry import TOYS

    assert TOYS.names() == ("fancy", "plain")
    assert TOYS.get("fancy", "model.toy").__name__ == "Fancy"
    assert TOYS.build("plain", "model.toy", x=3).x == 3
    assert TOYS.is_official("plain") and not TOYS.is_official("fancy")


def test_a_dotted_path_names_a_users_own_class(package: Path) -> None:
    (package / "mine.py").write_text("class Mine:\n    pass\n")
    from toyparts.registry import TOYS

    assert TOYS.get("toyparts.mine.Mine", "model.toy").__name__ == "Mine"
    assert not TOYS.is_official("toyparts.mine.Mine")


@pytest.mark.parametrize(("value", "message"), [
    ("nope", "model.toy='nope': no toy of that name; choose one of plain"),
    ("toyparts.missing.Cls", "model.toy='toyparts.missing.Cls': cannot import module 'toyparts.missing'"),
    ("toyparts.kinds.plain.Other", "module 'toyparts.kinds.plain' has no class 'Other'"),
    ("", "model.toy='': must name a toy"),
])
def test_a_bad_name_is_refused_naming_field_and_value(package: Path, value: str, message: str) -> None:
    _part(package, "plain", "plain", "Plain")
    from toyparts.registry import TOYS

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        TOYS.get(value, "model.toy")


def test_two_classes_under_one_name_are_refused() -> None:
    registry = Registry("toy", "json")

    @registry.register("same")
    class First:
        pass

    with pytest.raises(ValueError, match="toy 'same' is registered twice"):
        @registry.register("same")
        class Second:
            pass
