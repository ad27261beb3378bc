"""`DatasetAssets`: the tokenizers a dataset was built with, kept beside its shards and recorded in them.

`lumina-data build` saves them in the output directory (`tokenizer.json`, `visual_tokenizer/`) and records
their paths, relative to the shard, in each shard (`lumina.data.storage`); the HF export copies them beside
the weights, where `lumina-generate` finds them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lumina.tokenizers.visual import VisualTokenizer, VisualTokenizerRecord, check_unchanged

TEXT_FILE = "tokenizer.json"
VISUAL_DIR = "visual_tokenizer"


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class TextTokenizerRecord:
    path: str
    fingerprint: str


@dataclass(frozen=True)
class DatasetAssets:
    text_tokenizer: TextTokenizerRecord | None = None
    visual_tokenizer: VisualTokenizerRecord | None = None

    def to_json(self) -> dict[str, Any]:
        return {"text_tokenizer": None if self.text_tokenizer is None else vars(self.text_tokenizer),
                "visual_tokenizer": None if self.visual_tokenizer is None else self.visual_tokenizer.to_json()}

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str) -> DatasetAssets:
        text, visual = doc.get("text_tokenizer"), doc.get("visual_tokenizer")
        if text is not None and (not isinstance(text, dict) or sorted(text) != ["fingerprint", "path"]):
            raise ValueError(f"{where}: text tokenizer record {text!r}, expected {{'path', 'fingerprint'}}")
        return cls(None if text is None else TextTokenizerRecord(**text),
                   None if visual is None else VisualTokenizerRecord.from_json(visual, where))

    def relative_to(self, directory: str | Path) -> DatasetAssets:
        """Paths rewritten relative to `directory` (what a shard in `directory` stores)."""
        return self._map(lambda p: os.path.relpath(p, directory))

    def resolved_from(self, directory: str | Path) -> DatasetAssets:
        """Relative paths read from a shard in `directory` -> absolute paths."""
        return self._map(lambda p: str((Path(directory) / p).resolve()))

    def _map(self, fn) -> DatasetAssets:
        text = None if self.text_tokenizer is None else replace(self.text_tokenizer, path=fn(self.text_tokenizer.path))
        visual = None if self.visual_tokenizer is None else replace(self.visual_tokenizer,
                                                                    path=fn(self.visual_tokenizer.path))
        return DatasetAssets(text, visual)

    def same_as(self, other: DatasetAssets) -> bool:
        """The same tokenizers (by fingerprint), wherever their files lie."""
        def key(a: DatasetAssets):
            visual = None if a.visual_tokenizer is None else replace(a.visual_tokenizer, path="")
            return (None if a.text_tokenizer is None else a.text_tokenizer.fingerprint), visual
        return key(self) == key(other)

    def check_unchanged(self) -> None:
        """Raises if the tokenizer files (resolved paths) are no longer the ones recorded."""
        text = self.text_tokenizer
        if text is not None and file_digest(text.path) != text.fingerprint:
            raise ValueError(f"text tokenizer {text.path} changed since the data was built: recorded fingerprint "
                             f"{text.fingerprint}, the file has {file_digest(text.path)}")
        if self.visual_tokenizer is not None:
            check_unchanged(self.visual_tokenizer)

    def describe(self) -> str:
        text = "none" if self.text_tokenizer is None else self.text_tokenizer.path
        visual = "none" if self.visual_tokenizer is None else self.visual_tokenizer.describe()
        return f"text tokenizer {text}; visual tokenizer {visual}"


def save_assets(out_dir: str | Path, text_tokenizer: str | Path | None,
                visual_tokenizer: VisualTokenizer | None) -> DatasetAssets:
    """Save both tokenizers under out_dir (tokenizer.json, visual_tokenizer/); returns their records."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    text = None
    if text_tokenizer is not None:
        target = out / TEXT_FILE
        if Path(text_tokenizer).resolve() != target:
            shutil.copyfile(text_tokenizer, target)
        text = TextTokenizerRecord(str(target), file_digest(target))
    visual = None
    if visual_tokenizer is not None:
        visual = VisualTokenizerRecord.of(visual_tokenizer, visual_tokenizer.save(out / VISUAL_DIR))
    return DatasetAssets(text, visual)


def copy_assets(assets: DatasetAssets, directory: str | Path) -> list[Path]:
    """Copy the (resolved) tokenizer files into `directory` as tokenizer.json and visual_tokenizer/."""
    directory = Path(directory)
    written = []
    if assets.text_tokenizer is not None:
        written.append(Path(shutil.copyfile(assets.text_tokenizer.path, directory / TEXT_FILE)))
    if assets.visual_tokenizer is not None:
        written.append(Path(shutil.copytree(assets.visual_tokenizer.path, directory / VISUAL_DIR,
                                            dirs_exist_ok=True)))
    return written
