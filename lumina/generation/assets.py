"""What generation needs besides the weights: the text tokenizer, the special tokens, and the visual tokenizer
(codes <-> pixels: a plug-in's tokenizer set, e.g. the built-in world's, or the one a checkpoint carries in
`visual_tokenizer/`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lumina.contract.special_tokens import SpecialTokens
from lumina.data.dataset_assets import VISUAL_DIR
from lumina.model.config import LuminaConfig
from lumina.model.dtypes import float_dtype
from lumina.tokenizers.registry import TOKENIZER_SETS, TokenizerSet, load_visual_tokenizer, tokenizer_set_of
from lumina.tokenizers.text import (
    VOCABULARY_CHANGE,
    HFTokenizer,
    TextTokenizer,
    WordTokenizer,
    special_tokens_of,
)
from lumina.tokenizers.visual import VisualTokenizer, check_fits_model


@dataclass
class GenerationAssets:
    """image_tokenizer: None when no visual tokenizer is at hand (codes are then written as token files)."""

    text_tokenizer: TextTokenizer
    tokens: SpecialTokens
    image_tokenizer: VisualTokenizer | None
    name: str


def read_config(checkpoint: str | Path) -> LuminaConfig:
    """The LuminaConfig of an HF-layout checkpoint directory."""
    directory = Path(checkpoint)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint={str(checkpoint)!r}: no config.json there (expected an HF "
                                "checkpoint directory, e.g. <run>/hf)")
    return LuminaConfig.from_hf(directory)


def load_model(checkpoint: str | Path, device: str = "cpu", dtype: str = "float32") -> nn.Module:
    """An HF-layout checkpoint directory -> LuminaModel in eval mode on `device`, parameters in `dtype`."""
    from lumina.checkpoint.model_factory import build_model

    directory = Path(checkpoint)
    config = read_config(directory)
    torch_dtype = float_dtype("dtype", dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        model = build_model(config, init_from=directory, device=device)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def load_assets(checkpoint: str | Path, tokenizer: str, config: LuminaConfig, image_tokenizer: str = "auto",
                device: str | None = None) -> GenerationAssets:
    """tokenizer: a registered tokenizer set ("world": the built-in world's tokenizers), a tokenizer.json path,
    or "auto" (the checkpoint's tokenizer.json; a tokenizer set's when it holds that set's vocabulary; a
    checkpoint without one is refused). image_tokenizer: "auto" (the checkpoint's visual_tokenizer/, else the
    tokenizer set's, else none), "none", a built-in name ("builtin"), "atoken" or a saved tokenizer directory;
    its codebooks must be the model's. device: where the visual tokenizer runs (None / "auto": its default;
    AToken's is CUDA). `name` of the result: the tokenizer set's name, else the tokenizer.json path."""
    directory = Path(checkpoint)
    if tokenizer == "auto":
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"checkpoint={str(checkpoint)!r} has no tokenizer.json: pass tokenizer=PATH (or "
                                    f"a tokenizer set: {', '.join(TOKENIZER_SETS.names())}); built-in-world "
                                    f"checkpoints made before {VOCABULARY_CHANGE} carry none and are refused")
        tokenizer = str(directory / "tokenizer.json")
        tokenizer = _tokenizer_set_name(tokenizer) or tokenizer
    found = TOKENIZER_SETS.find(tokenizer)
    visual = _visual_tokenizer(directory, image_tokenizer, found, config, device)
    if found is not None:
        text = found.text()
        image = visual or load_visual_tokenizer(found.visual)
        _check_fits(tokenizer, config, text.vocab_size, image.codebook_size, image.num_codebooks)
        return GenerationAssets(text, found.special_tokens(text, image), visual, tokenizer)
    path = Path(tokenizer)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer={tokenizer!r}: no such tokenizer file (nor a tokenizer set: "
                                f"{', '.join(TOKENIZER_SETS.names())})")
    try:
        text: TextTokenizer = WordTokenizer.load(path)
    except ValueError:
        text = HFTokenizer(path)
    overrides = {} if "<|pad|>" in text.special_ids else {"pad": config.pad_token_id}
    tokens = special_tokens_of(text, config.codebook_size, config.num_codebooks,
                               image_vocab_size=config.image_vocab_size, **overrides)
    return GenerationAssets(text, tokens, visual, str(path))


def _tokenizer_set_name(path: str) -> str | None:
    """The tokenizer set whose vocabulary the word-level tokenizer.json at `path` holds, or None."""
    try:
        return tokenizer_set_of(WordTokenizer.load(path))
    except ValueError as error:
        if VOCABULARY_CHANGE in str(error):
            raise
        return None


def _visual_tokenizer(checkpoint: Path, spec: str, tokenizer_set: TokenizerSet | None, config: LuminaConfig,
                      device: str) -> VisualTokenizer | None:
    if spec == "none":
        return None
    if spec == "auto":
        if not (checkpoint / VISUAL_DIR).is_dir():
            return None if tokenizer_set is None else load_visual_tokenizer(tokenizer_set.visual)
        spec = str(checkpoint / VISUAL_DIR)
    visual = load_visual_tokenizer(spec, device=device)
    check_fits_model(visual, config.num_codebooks, config.codebook_size, f"image_tokenizer={spec}")
    return visual


def _check_fits(name: str, config: LuminaConfig, vocab: int, codebook_size: int, num_codebooks: int) -> None:
    if vocab > config.vocab_size or codebook_size > config.codebook_size or num_codebooks != config.num_codebooks:
        raise ValueError(f"tokenizer={name} does not fit the checkpoint: {name} vocab {vocab} / {num_codebooks} "
                         f"codebooks of {codebook_size}, model vocab_size={config.vocab_size}, num_codebooks="
                         f"{config.num_codebooks}, codebook_size={config.codebook_size}")
