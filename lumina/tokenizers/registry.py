"""`load_visual_tokenizer(spec)`: the visual tokenizer a command names, by name.

    "builtin"   the built-in world's residual VQ (resolved in `lumina.world`)
    "atoken"    the official AToken (`ATokenTokenizer.from_pretrained`)
    DIR         a saved tokenizer directory, loaded by the "name" in its visual_tokenizer.json (`LOADERS`)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lumina.tokenizers.atoken import ATokenTokenizer
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.visual import CONFIG_FILE, VisualTokenizer, read_config
from lumina.world.dataset import world_visual_tokenizer

BUILTIN, ATOKEN = "builtin", "atoken"
LOADERS: dict[str, Any] = {
    RVQVisualTokenizer.name: lambda directory, device: RVQVisualTokenizer.load(directory),  # CPU only
    ATokenTokenizer.name: ATokenTokenizer.load,
}


def load_visual_tokenizer(spec: str | Path, device: str | None = None, atoken_config: str | None = None,
                          atoken_checkpoint: str | None = None, atoken_package: str | None = None
                          ) -> VisualTokenizer:
    """spec -> the tokenizer (module docstring). device: where AToken runs (None / "auto": CUDA); the built-in
    one runs on the CPU."""
    if str(spec) == BUILTIN:
        return world_visual_tokenizer()
    if str(spec) == ATOKEN:
        return ATokenTokenizer.from_pretrained(atoken_config, atoken_checkpoint, atoken_package, device)
    doc = read_config(spec)
    loader = LOADERS.get(doc["name"])
    if loader is None:
        raise ValueError(f"{Path(spec) / CONFIG_FILE}: name={doc['name']!r}; expected one of {sorted(LOADERS)}")
    return loader(spec, device)
