"""Plug-ins: packages that register, by name, what lumina's generic code looks up (a built-in dataset and
its tokenizers, system prompts, tasks, an evaluation). A plug-in is a module named in the `lumina.plugins`
entry-point group of an installed distribution; lumina's own is the built-in world (`lumina.world.plugin`,
pyproject.toml). Every plug-in is imported once, before the first look-up in any `PluginRegistry`; no generic
module imports one.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Generic, TypeVar

GROUP = "lumina.plugins"
T = TypeVar("T")
_loaded = False


def load_plugins() -> None:
    """Import every module of the `lumina.plugins` entry-point group (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # before importing: a plug-in's own look-ups must not re-enter
    for entry in importlib.metadata.entry_points(group=GROUP):
        try:
            entry.load()
        except Exception as error:
            raise ImportError(f"lumina plug-in {entry.name!r} ({entry.value}) failed to import: {error}") from error


class PluginRegistry(Generic[T]):
    """Names -> objects that plug-ins register (`add`); `kind` names what they are in errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        known = self._items.get(name)
        if known is not None and known != item:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = item
        return item

    def names(self) -> tuple[str, ...]:
        load_plugins()
        return tuple(sorted(self._items))

    def find(self, name: str) -> T | None:
        """The object registered as `name`, or None."""
        load_plugins()
        return self._items.get(name)

    def get(self, name: str, field: str) -> T:
        """The object registered as `name`; ValueError naming the field, the value and the choices."""
        item = self.find(name)
        if item is None:
            raise ValueError(f"{field}={name!r}: no {self.kind} of that name (registered: "
                             f"{', '.join(self.names()) or 'none; is lumina installed (pip install -e .)?'})")
        return item

    def __iter__(self) -> Iterator[tuple[str, T]]:
        load_plugins()
        return iter(sorted(self._items.items()))
