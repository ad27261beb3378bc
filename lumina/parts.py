"""Research parts chosen by name: one `Registry` per kind of part (router, attention rule, image head, ...).
A part is a class behind its kind's small protocol, registered in the module that defines it
(`@ROUTERS.register("softmax")`) and named by a config (`score_function: softmax`). A new part of lumina's
own is one new module in the kind's package (every module there is imported before a look-up); a user's own
is named by its dotted path (`my_pkg.routers.MyRouter`). `official` marks the released model's parts; the
official export refuses the others.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Registry:
    """Names -> classes of one kind of part. `kind` names the kind in errors; `package` is where lumina's own
    parts of this kind live; `official_choices` are names the caller resolves itself that stand for the
    released model's choice (the attention rule's `auto`)."""

    def __init__(self, kind: str, package: str, official_choices: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.package = package
        self._parts: dict[str, type] = {}
        self._official: set[str] = set(official_choices)
        self._discovered = False

    def register(self, name: str, official: bool = False) -> Callable[[type[T]], type[T]]:
        """Class decorator: register the class under `name` (official: the released model's choice)."""

        def add(cls: type[T]) -> type[T]:
            known = self._parts.get(name)
            if known is not None and known is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice: {_path(known)} and {_path(cls)}")
            self._parts[name] = cls
            if official:
                self._official.add(name)
            return cls

        return add

    def _discover(self) -> None:
        if self._discovered:
            return
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{self.package}.{module.name}")
        self._discovered = True

    def names(self) -> tuple[str, ...]:
        """Every registered name of lumina's own parts, sorted."""
        self._discover()
        return tuple(sorted(self._parts))

    def get(self, name: str, field: str) -> type:
        """The class registered as `name`, or the class at a dotted path `pkg.module.Class`. `field` is the
        config field that named it; a bad name raises ValueError naming the field, the value and the choices."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{field}={name!r}: must name a {self.kind} ({', '.join(self.names())}) or a "
                             "dotted path to a class")
        if "." in name:
            return _import_class(name, field, self.kind)
        self._discover()
        if name not in self._parts:
            raise ValueError(f"{field}={name!r}: no {self.kind} of that name; choose one of "
                             f"{', '.join(self.names())}, or give a dotted path to your own class")
        return self._parts[name]

    def build(self, name: str, field: str, *args: Any, **kwargs: Any) -> Any:
        """`get(name, field)(*args, **kwargs)`."""
        return self.get(name, field)(*args, **kwargs)

    def is_official(self, name: str) -> bool:
        """Whether `name` is a part of the released model (what the official-layout export accepts)."""
        self._discover()
        return name in self._official


def _import_class(path: str, field: str, kind: str) -> type:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{field}={path!r}: cannot import module {module_name!r} for the {kind}: {error}") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"{field}={path!r}: module {module_name!r} has no class {attr!r}")
    return cls


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
