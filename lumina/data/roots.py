"""Dataset roots: a directory whose splits are its `train/` and `val/` subdirectories.

The held-out split is the one of `VAL_DIRS` present (two are ambiguous and refused). `test/` is never read
(it stays yours for the final evaluation). A directory without `train/` is not a root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TRAIN_DIR = "train"
VAL_DIRS = ("val", "validation", "valid", "dev")  # the held-out split's accepted names


@dataclass(frozen=True)
class DatasetRoot:
    train: Path
    val: Path | None

    def describe(self, root: str | Path) -> str:
        held = "no held-out split" if self.val is None else f"the held-out split from {self.val}"
        return f"{root} is a dataset root: training reads {self.train}, {held}"


def dataset_root(path: str | Path) -> DatasetRoot | None:
    """The splits of a dataset root (module docstring), or None when `path` is not one."""
    root = Path(path)
    if not (root / TRAIN_DIR).is_dir():
        return None
    found = [root / name for name in VAL_DIRS if (root / name).is_dir()]
    if len(found) > 1:
        raise ValueError(f"{root} holds both {found[0].name}/ and {found[1].name}/; keep one held-out split")
    return DatasetRoot(root / TRAIN_DIR, found[0] if found else None)
