"""Built-in datasets: what a data source with `path: null` reads, registered by a plug-in under a name (the
built-in world's: "world"). `datasets(options, field)` -> the train and held-out sample datasets (`field`
names the source's options in errors); `assets()` -> the tokenizers an HF export of a run on it carries."""

from __future__ import annotations

from typing import Any, Protocol

from lumina.data.dataset_assets import DatasetAssets
from lumina.plugins import PluginRegistry


class BuiltinDataset(Protocol):
    def datasets(self, options: dict[str, Any], field: str) -> tuple[Any, Any]: ...

    def assets(self) -> DatasetAssets: ...


BUILTIN_DATASETS: PluginRegistry[BuiltinDataset] = PluginRegistry("built-in dataset")


def builtin_dataset(name: str | None, field: str) -> BuiltinDataset:
    """The built-in dataset `name`; None: the only one registered (several: ValueError naming `field`)."""
    if name is not None:
        return BUILTIN_DATASETS.get(name, field)
    names = BUILTIN_DATASETS.names()
    if len(names) != 1:
        raise ValueError(f"{field}=null: name one of the built-in datasets {list(names)} (a source with path "
                         "null reads one)")
    return BUILTIN_DATASETS.get(names[0], field)
