"""Training reads the tokenizers a dataset records: the visual tokenizer must code the model's C x K codes,
held-out shards must record the same tokenizers, null pad_id / num_codebooks come from the data, and the data
module copies the tokenizers into an HF export."""

from __future__ import annotations

import numpy as np
import pytest
from pixel_helpers import picture

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.data.dataset_assets import save_assets
from lumina.data.storage import ShardWriter
from lumina.model.config import LuminaConfig
from lumina.tokenizers.pixels import to_signed
from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer, RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.text import WordTokenizer, special_tokens_of
from lumina.training.data_factory import build_datamodule
from lumina.training.errors import ConfigError


def fitted(codebook_size: int, num_codebooks: int, seed: int = 0) -> RVQVisualTokenizer:
    rng = np.random.default_rng(seed)
    images = to_signed(np.stack([picture(rng, 16, 16) for _ in range(6)]))
    return RVQVisualTokenizer(RVQImageTokenizer.fit(images, RVQSettings(4, codebook_size, num_codebooks, 4, seed)), 16)


def write_dataset(root, tokenizer: RVQVisualTokenizer, n: int = 6) -> tuple[str, str]:
    """train / val shards of t2i samples coded by `tokenizer`, with a word vocabulary; returns their dirs."""
    words = WordTokenizer(["a", "box"])
    words.save(root / "tokenizer.json")
    assets = save_assets(root, root / "tokenizer.json", tokenizer)
    tokens = special_tokens_of(words, tokenizer.codebook_size, tokenizer.num_codebooks)
    rng = np.random.default_rng(1)
    codes, grid = tokenizer.encode(to_signed(np.stack([picture(rng, 16, 16) for _ in range(n)])))
    samples = [Sample(f"s{i}", [Turn("user", [Text(words.encode("a box"))]),
                                Turn("assistant", [Media("image", codes[i], grid)])]) for i in range(n)]
    for split, part in (("train", samples[:-2]), ("val", samples[-2:])):
        with ShardWriter(root / split, tokens, assets=assets) as writer:  # what `lumina-data build` writes
            for sample in part:
                writer.write(sample)
    return str(root / "train"), str(root / "val")


def config(train: str, val: str | None) -> dict:
    return {"seq_len": 128, "pad_id": None, "num_codebooks": None,
            "sources": [{"name": "mine", "path": train, "options": {"val_path": val}}]}


def test_recorded_tokenizer_reaches_the_data_module_and_the_export(tmp_path):
    train, val = write_dataset(tmp_path, fitted(64, 4))
    dm = build_datamodule(config(train, val), LuminaConfig.tiny())
    assert (dm.config.pad_id, dm.config.num_codebooks) == (0, 4)  # the word vocabulary's pad, the data's C
    assert dm.assets.visual_tokenizer.path == str(tmp_path / "visual_tokenizer")
    export = tmp_path / "hf"
    export.mkdir()
    dm.export_assets(export)
    assert (export / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in (export / "visual_tokenizer").iterdir()) == ["rvq.safetensors",
                                                                               "visual_tokenizer.json"]


@pytest.mark.parametrize("model_sizes", [dict(num_codebooks=4, codebook_size=128), dict(num_codebooks=5)])
def test_a_tokenizer_that_does_not_code_the_models_codebooks_is_refused(tmp_path, model_sizes):
    train, val = write_dataset(tmp_path, fitted(64, 4))
    model = LuminaConfig.tiny(**model_sizes)
    c, k = model.num_codebooks, model.codebook_size
    with pytest.raises(ConfigError, match=rf"data.sources\[0\] \(.*visual_tokenizer\): the visual tokenizer rvq has "
                                          rf"num_codebooks=4, codebook_size=64; the model has num_codebooks={c}, "
                                          rf"codebook_size={k}"):
        build_datamodule(config(train, val), model)


def test_held_out_shards_of_another_tokenizer_are_refused(tmp_path):
    train, _ = write_dataset(tmp_path / "a", fitted(64, 4, seed=0))
    _, other_val = write_dataset(tmp_path / "b", fitted(64, 4, seed=1))
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: its shards record other tokenizers than "
                                          r"data.sources\[0\].options.val_path"):
        build_datamodule(config(train, other_val), LuminaConfig.tiny())


def test_explicit_pad_id_is_still_checked(tmp_path):
    train, val = write_dataset(tmp_path, fitted(64, 4))
    with pytest.raises(ConfigError, match=r"data.pad_id=7: the data's pad token is 0"):
        build_datamodule({**config(train, val), "pad_id": 7}, LuminaConfig.tiny())


def test_tokenizer_files_replaced_after_the_build_are_refused(tmp_path):
    train, val = write_dataset(tmp_path, fitted(64, 4))
    fitted(64, 4, seed=5).save(tmp_path / "visual_tokenizer")  # another fit over the dataset's copy
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: visual tokenizer at .*visual_tokenizer changed since "
                                          r"the data was built"):
        build_datamodule(config(train, val), LuminaConfig.tiny())
    train, val = write_dataset(tmp_path / "b", fitted(64, 4))
    (tmp_path / "b" / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"text tokenizer .*tokenizer.json changed since the data was built"):
        build_datamodule(config(train, val), LuminaConfig.tiny())


def test_data_tokenizer_checks_data_whose_codebooks_come_from_the_data(tmp_path):
    """data.tokenizer (experiment=finetune sets it to the checkpoint's) with data.num_codebooks null (data=parquet):
    the expected settings take C from the model, and a tokenizer of another vocabulary is refused by name."""
    train, val = write_dataset(tmp_path, fitted(64, 4))
    dm = build_datamodule({**config(train, val), "tokenizer": str(tmp_path / "tokenizer.json")}, LuminaConfig.tiny())
    assert dm.config.num_codebooks == 4
    WordTokenizer(["a", "box", "sphere"]).save(tmp_path / "other" / "tokenizer.json")
    with pytest.raises(ValueError, match=r"special-token/codebook settings differ from the expected settings: "
                                         r"text_vocab_size"):
        build_datamodule({**config(train, val), "tokenizer": str(tmp_path / "other" / "tokenizer.json")},
                         LuminaConfig.tiny())
