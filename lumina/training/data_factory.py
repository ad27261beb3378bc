"""`build_datamodule`: the LuminaDataModule a training config asks for (a built-in dataset and/or Parquet shards,
one source or a weighted mixture), checked against the model's sizes and, when given, a tokenizer.json.
Tokenizers the shards record (`lumina.data.dataset_assets`) go to the data module, which the HF export copies."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from lumina.contract.special_tokens import SpecialTokens
from lumina.data.builtin import builtin_dataset
from lumina.data.datamodule import DataConfig, LuminaDataModule
from lumina.data.dataset_assets import DatasetAssets
from lumina.data.mixture import ConcatSampleDataset, MixturePlan
from lumina.data.noise import NoiseConfig
from lumina.data.packed_dataset import LayoutSource, MixtureSource
from lumina.model.config import LuminaConfig
from lumina.training.errors import ConfigError

log = logging.getLogger(__name__)


def build_datamodule(data: dict[str, Any], model: LuminaConfig) -> LuminaDataModule:
    """data: the plain `cfg.data` mapping. A source with `path: null` is a built-in dataset (the built-in world,
    `lumina.data.builtin`), a path is Parquet
    shards or a dataset root (train/ and val/ or validation/). Several sources form a weighted mixture
    (`samples_per_epoch` slots per epoch) validated on the concatenation of their held-out sets."""
    data = dict(data)
    tokenizer = data.pop("tokenizer", None)
    config = DataConfig(**data)
    if not config.sources:
        raise ConfigError("data.sources is empty; list at least one source")
    names = [spec.name for spec in config.sources]
    if len(set(names)) != len(names):
        raise ConfigError(f"data.sources names {names}: must be unique")
    expected = expected_tokens(tokenizer, config, model) if tokenizer is not None else None
    if "schedule" in config.noise:
        raise ConfigError(f"data.noise.schedule={config.noise['schedule']!r}: the masking schedule is the model's "
                          "(model.config.masking_schedule, or `schedule=NAME`), so lumina-generate samples as it "
                          "was trained")
    noise = NoiseConfig(**config.noise, schedule=model.masking_schedule)
    trains, vals = {}, {}
    assets: DatasetAssets | None = None
    builtin_assets: DatasetAssets | None = None
    for i, spec in enumerate(config.sources):
        if spec.path is None:
            try:
                builtin = builtin_dataset(spec.builtin, f"data.sources[{i}].builtin")
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            train, val = builtin.datasets(spec.options, f"data.sources[{i}].options")
            builtin_assets = builtin.assets()
        else:
            train, val = parquet_datasets(spec.path, spec.options, expected, i)
            assets = check_assets(train, val, model, i, assets)
        config = resolve_from_data(config, train.tokens)
        check_tokens(train.tokens, config, model, expected)
        trains[spec.name] = train
        if val is not None:
            vals[spec.name] = val
    if assets is None and all(spec.path is None for spec in config.sources):
        assets = builtin_assets  # the HF export carries the built-in dataset's tokenizer.json
    if len(trains) == 1:
        (train,) = trains.values()
        train_source = LayoutSource(train, noise, config.seed)
        val = next(iter(vals.values()), None)
    else:
        per_epoch = config.samples_per_epoch or sum(len(ds) for ds in trains.values())
        mixture = MixturePlan(trains, {spec.name: spec.weight for spec in config.sources}, config.seed, per_epoch)
        train_source = MixtureSource(mixture, noise, config.seed)
        val = ConcatSampleDataset(vals) if vals else None
    val_source = None if val is None else LayoutSource(val, noise, config.val_seed, eval_t=config.val_noise_t)
    return LuminaDataModule(config, train_source, val_source, assets=assets)


PARQUET_OPTIONS = ("val_path", "cache_row_groups", "read_attempts")


def parquet_datasets(path: str, options: dict[str, Any], expected: SpecialTokens | None, index: int = 0):
    """Train (and held-out) Parquet datasets at a local path or fsspec URL. options: val_path,
    cache_row_groups (row groups kept decoded, 16), read_attempts (tries of a store read, 4)."""
    from lumina.data.storage import ParquetSampleDataset
    from lumina.files.fs import Retry, is_url

    unknown = sorted(set(options) - set(PARQUET_OPTIONS))
    if unknown:
        raise ConfigError(f"data.sources[{index}].options.{unknown[0]}: unknown option of a Parquet source "
                          f"(expected one of {PARQUET_OPTIONS})")
    path, options = root_splits(path, options, index)
    for name, value in (("path", path), ("options.val_path", options.get("val_path"))):
        if value is not None and not is_url(value) and not Path(value).exists():
            raise ConfigError(f"data.sources[{index}].{name}={value!r}: no such file or directory")
    try:
        reading = dict(cache_row_groups=int(options.get("cache_row_groups", 16)),
                       retry=Retry(attempts=int(options.get("read_attempts", 4))))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data.sources[{index}].options.cache_row_groups / read_attempts: {exc}") from exc
    train = ParquetSampleDataset(path, tokens=expected, **reading)
    val_path = options.get("val_path")
    val = ParquetSampleDataset(val_path, tokens=train.tokens, **reading) if val_path is not None else None
    return train, val


def root_splits(path: str, options: dict[str, Any], index: int) -> tuple[str, dict[str, Any]]:
    """A dataset root (`lumina.data.roots`) -> its train path and val_path; any other path as given."""
    from lumina.data.roots import dataset_root

    try:
        root = dataset_root(path)
    except ValueError as exc:
        raise ConfigError(f"data.sources[{index}].path: {exc}") from exc
    if root is None:
        return path, options
    if options.get("val_path") is not None:
        raise ConfigError(f"data.sources[{index}].path={path!r} is a dataset root (train/ and its held-out split); "
                          f"drop options.val_path={options['val_path']!r}, or point path at the train shards")
    log.info("data.sources[%d]: %s", index, root.describe(path))
    return str(root.train), {**options, "val_path": None if root.val is None else str(root.val)}


def resolve_from_data(config: DataConfig, found: SpecialTokens) -> DataConfig:
    """data.pad_id / data.num_codebooks null -> the data's own."""
    return dataclasses.replace(config, pad_id=found.pad if config.pad_id is None else config.pad_id,
                               num_codebooks=found.num_codebooks if config.num_codebooks is None
                               else config.num_codebooks)


def check_assets(train, val, model: LuminaConfig, index: int, previous: DatasetAssets | None) -> DatasetAssets:
    """The tokenizers source `index` records, checked against its held-out split, earlier sources, model."""
    from lumina.tokenizers.visual import check_fits_model

    found = train.assets
    for other, what in ((val.assets if val is not None else None, f"data.sources[{index}].options.val_path"),
                        (previous, "the earlier sources")):
        if other is not None and not other.same_as(found):
            raise ConfigError(f"data.sources[{index}]: its shards record other tokenizers than {what} "
                              f"({found.describe()} vs {other.describe()})")
    try:
        found.check_unchanged()
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"data.sources[{index}]: {exc}") from exc
    if found.visual_tokenizer is not None:
        try:
            check_fits_model(found.visual_tokenizer, model.num_codebooks, model.codebook_size,
                             f"data.sources[{index}] ({found.visual_tokenizer.path})")
        except ValueError as exc:
            raise ConfigError(f"{exc}: set model.config.num_codebooks / codebook_size") from exc
    return found


def expected_tokens(tokenizer: str, config: DataConfig, model: LuminaConfig) -> SpecialTokens:
    """The SpecialTokens a tokenizer.json defines; the image sizes, which a tokenizer.json does not hold, are the
    model's (C: data.num_codebooks, or the model's when it is null, as the data's C must equal the model's)."""
    from lumina.tokenizers.text import HFTokenizer, special_tokens_of

    if not Path(tokenizer).is_file():
        raise ConfigError(f"data.tokenizer={tokenizer!r}: no such tokenizer file")
    num_codebooks = model.num_codebooks if config.num_codebooks is None else config.num_codebooks
    return special_tokens_of(HFTokenizer(tokenizer), model.codebook_size, num_codebooks,
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
    pairs = [  # (the data's name, its value, the model's field, rule)
        ("num_codebooks", found.num_codebooks, "num_codebooks", "=="),
        ("data.num_codebooks", config.num_codebooks, "num_codebooks", "=="),
        ("text_vocab_size", found.text_vocab_size, "vocab_size", "<="),
        ("codebook_size", found.codebook_size, "codebook_size", "<="),
        ("image_vocab_size", found.image_vocab_size, "image_vocab_size", "<="),
    ]
    for name, data_value, field, rule in pairs:
        model_value = getattr(model, field)
        if not (data_value == model_value if rule == "==" else data_value <= model_value):
            raise ConfigError(f"model.config.{field}={model_value}: incompatible with the data's {name}="
                              f"{data_value} (must be {rule} it)")
