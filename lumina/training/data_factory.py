"""`build_datamodule`: the LuminaDataModule a training config asks for (built-in world or Parquet shards),
checked against the model's sizes and, when given, a tokenizer.json's special tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lumina.data.datamodule import DataConfig, LuminaDataModule
from lumina.data.dataset import LayoutSource
from lumina.data.noise import NoiseConfig
from lumina.data.special_tokens import SpecialTokens
from lumina.model.config import LuminaConfig
from lumina.training.errors import ConfigError

# Keys of the data group that lumina-train reads itself (not DataConfig fields).
TRAINER_DATA_KEYS = ("tokenizer",)
WORLD_OPTIONS = ("num_samples", "val_samples", "seed", "mix")


def build_datamodule(data: dict[str, Any], model: LuminaConfig) -> LuminaDataModule:
    """data: the plain `cfg.data` mapping. One source: `path: null` is the built-in world (options
    num_samples, val_samples, seed, mix), a path is Parquet shards (options val_path)."""
    data = dict(data)
    tokenizer = data.pop("tokenizer", None)
    config = DataConfig(**data)
    if len(config.sources) != 1:
        raise ConfigError(f"data.sources has {len(config.sources)} entries; lumina-train reads exactly one")
    spec = config.sources[0]
    expected = expected_tokens(tokenizer, config, model) if tokenizer is not None else None
    noise = NoiseConfig(**config.noise)
    if spec.path is None:
        train, val = world_datasets(spec.options)
    else:
        train, val = parquet_datasets(spec.path, spec.options, expected)
    check_tokens(train.tokens, config, model, expected)
    train_source = LayoutSource(train, noise, config.seed)
    val_source = None if val is None else LayoutSource(val, noise, config.val_seed, eval_t=config.val_noise_t)
    return LuminaDataModule(config, train_source, val_source)


def world_datasets(options: dict[str, Any]):
    from lumina.data.world import build_world

    unknown = sorted(set(options) - set(WORLD_OPTIONS))
    if unknown:
        raise ConfigError(f"data.sources[0].options.{unknown[0]}: unknown option of the built-in world "
                          f"(expected {WORLD_OPTIONS})")
    seed = int(options.get("seed", 0))
    train = build_world("train", int(options.get("num_samples", 2000)), seed, options.get("mix"))
    val = build_world("val", int(options.get("val_samples", 64)), seed, options.get("mix"),
                      image_tokenizer=train.image_tokenizer)
    return train.dataset, val.dataset


def parquet_datasets(path: str, options: dict[str, Any], expected: SpecialTokens | None):
    from lumina.data.storage import ParquetSampleDataset

    unknown = sorted(set(options) - {"val_path"})
    if unknown:
        raise ConfigError(f"data.sources[0].options.{unknown[0]}: unknown option of a Parquet source "
                          "(expected val_path)")
    for name, value in (("path", path), ("options.val_path", options.get("val_path"))):
        if value is not None and not Path(value).exists():
            raise ConfigError(f"data.sources[0].{name}={value!r}: no such file or directory")
    train = ParquetSampleDataset(path, tokens=expected)
    val_path = options.get("val_path")
    val = ParquetSampleDataset(val_path, tokens=train.tokens) if val_path is not None else None
    return train, val


def expected_tokens(tokenizer: str, config: DataConfig, model: LuminaConfig) -> SpecialTokens:
    """The SpecialTokens a tokenizer.json defines (image sizes from the model)."""
    from lumina.data.tokenizers.text import HFTokenizer, special_tokens_of

    if not Path(tokenizer).is_file():
        raise ConfigError(f"data.tokenizer={tokenizer!r}: no such tokenizer file")
    return special_tokens_of(HFTokenizer(tokenizer), model.codebook_size, config.num_codebooks,
                             image_vocab_size=model.image_vocab_size)


def check_tokens(found: SpecialTokens, config: DataConfig, model: LuminaConfig,
                 expected: SpecialTokens | None) -> None:
    """The data's token settings must fit the model (and agree with the tokenizer when one is given)."""
    if expected is not None and found != expected:
        diffs = [f"{k}: data {getattr(found, k)}, tokenizer {getattr(expected, k)}"
                 for k in found.__dataclass_fields__ if getattr(found, k) != getattr(expected, k)]
        raise ConfigError(f"data.tokenizer: the data's special tokens differ from the tokenizer's ({'; '.join(diffs)})")
    if config.pad_id != found.pad:
        raise ConfigError(f"data.pad_id={config.pad_id}: the data's pad token is {found.pad}")
    pairs = [
        ("num_codebooks", found.num_codebooks, model.num_codebooks, "=="),
        ("data.num_codebooks", config.num_codebooks, model.num_codebooks, "=="),
        ("text_vocab_size", found.text_vocab_size, model.vocab_size, "<="),
        ("codebook_size", found.codebook_size, model.codebook_size, "<="),
        ("image_vocab_size", found.image_vocab_size, model.image_vocab_size, "<="),
    ]
    for name, data_value, model_value, rule in pairs:
        ok = data_value == model_value if rule == "==" else data_value <= model_value
        if not ok:
            field = "num_codebooks" if "num_codebooks" in name else {
                "text_vocab_size": "vocab_size"}.get(name, name)
            raise ConfigError(f"model.config.{field}={model_value}: incompatible with the data's {name}="
                              f"{data_value} (must be {rule} it)")
