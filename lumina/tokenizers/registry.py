"""Tokenizers by name. `load_visual_tokenizer(spec)`: the visual tokenizer a command names:

    a built-in name   one a plug-in registered in `VISUAL_TOKENIZERS` (the built-in world's: "builtin")
    "atoken"          the official AToken (`ATokenTokenizer.from_pretrained`)
    DIR               a saved tokenizer directory, loaded by the "name" in its visual_tokenizer.json (`LOADERS`)

`TOKENIZER_SETS`: a plug-in's text tokenizer, visual tokenizer and special tokens under one name (the
built-in world's: "world"), which `lumina-generate tokenizer=NAME` picks and `tokenizer=auto` recognises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumina.contract.special_tokens import SpecialTokens
from lumina.plugins import PluginRegistry
from lumina.tokenizers.atoken import ATokenTokenizer
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.text import TextTokenizer, WordTokenizer
from lumina.tokenizers.visual import CONFIG_FILE, VisualTokenizer, read_config

ATOKEN = "atoken"
LOADERS: dict[str, Any] = {
    RVQVisualTokenizer.name: lambda directory, device: RVQVisualTokenizer.load(directory),  # CPU only
    ATokenTokenizer.name: ATokenTokenizer.load,
}
VISUAL_TOKENIZERS: PluginRegistry[Callable[[], VisualTokenizer]] = PluginRegistry("built-in visual tokenizer")


@dataclass(frozen=True)
class TokenizerSet:
    """A plug-in's tokenizers: `text()` its word-level text tokenizer (its vocabulary identifies checkpoints
    trained on it), `visual` the name of its visual tokenizer, `special_tokens(text, visual)` its ids."""

    text: Callable[[], WordTokenizer]
    visual: str
    special_tokens: Callable[[TextTokenizer, VisualTokenizer], SpecialTokens]


TOKENIZER_SETS: PluginRegistry[TokenizerSet] = PluginRegistry("tokenizer set")


def tokenizer_set_of(text: TextTokenizer) -> str | None:
    """The name of the registered tokenizer set whose vocabulary `text` holds, or None."""
    if not isinstance(text, WordTokenizer):
        return None
    for name, found in TOKENIZER_SETS:
        if found.text().vocab == text.vocab:
            return name
    return None


def load_visual_tokenizer(spec: str | Path, device: str | None = None, atoken_config: str | None = None,
                          atoken_checkpoint: str | None = None, atoken_package: str | None = None
                          ) -> VisualTokenizer:
    """spec -> the tokenizer (module docstring). device: where AToken runs (None / "auto": CUDA); the built-in
    ones run on the CPU."""
    builtin = VISUAL_TOKENIZERS.find(str(spec))
    if builtin is not None:
        return builtin()
    if str(spec) == ATOKEN:
        return ATokenTokenizer.from_pretrained(atoken_config, atoken_checkpoint, atoken_package, device)
    doc = read_config(spec)
    loader = LOADERS.get(doc["name"])
    if loader is None:
        raise ValueError(f"{Path(spec) / CONFIG_FILE}: name={doc['name']!r}; expected one of {sorted(LOADERS)}")
    return loader(spec, device)
