"""Parquet storage: Sample -> row -> Sample round trips, plain-pyarrow readability, stored lengths, settings."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from sample_helpers import NEWLINE, assert_samples_equal, codes, mixed_samples

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.storage import (
    LENGTH_COLUMNS,
    InMemorySampleDataset,
    ParquetSampleDataset,
    ShardWriter,
    write_samples,
)


def fake_length(sample: Sample, drop_text: bool, drop_image: bool) -> int:
    """Distinct per variant, so a swapped column is caught: 1000*drop_text + 100*drop_image + #turns."""
    return 1000 * drop_text + 100 * drop_image + len(sample.turns)


def test_round_trip_through_parquet(tmp_path, tokens):
    samples = mixed_samples()
    paths = write_samples(samples, tmp_path, tokens, fake_length, rows_per_shard=2)
    assert [p.name for p in paths] == ["shard-00000.parquet", "shard-00001.parquet"]
    ds = ParquetSampleDataset(tmp_path, tokens)
    assert len(ds) == 3
    for i, sample in enumerate(samples):
        assert_samples_equal(ds[i], sample)
    assert_samples_equal(ds[-1], samples[-1])
    assert ds.sample_ids() == ["und-0", "t2i-0", "chat-0"]
    # hand-computed: (#turns, +100 image dropped, +1000 text dropped)
    expected = np.array([[t, 1000 + t, 100 + t, 1100 + t] for t in (2, 2, 5)])
    np.testing.assert_array_equal(ds.laid_out_lengths(), expected)
    with pytest.raises(IndexError, match="index=3"):
        ds[3]


def test_plain_pyarrow_reads_the_rows(tmp_path, tokens):
    samples = mixed_samples()
    write_samples(samples, tmp_path, tokens, fake_length)
    table = pq.read_table(tmp_path / "shard-00000.parquet")
    assert table.column_names == ["id", "source", "turns", *LENGTH_COLUMNS]
    row = table.slice(0, 1).to_pylist()[0]
    assert row["id"] == "und-0" and row["source"] == "und"
    image, text, video, mesh = row["turns"][0]["parts"]
    assert image["kind"] == "image" and image["grid"] == [2, 3]
    assert image["codes"] == samples[0].turns[0].parts[0].codes.flatten().tolist()  # [N, C] row-major
    assert text == {"kind": "text", "ids": [10, 11, 12], "grid": None, "codes": None}
    assert video["grid"] == [2, 2, 3] and mesh["grid"] == [2, 3, 2]
    assert row["len_drop_image"] == 102
    meta = json.loads(table.schema.metadata[b"lumina"])
    assert meta["special_tokens"]["codebook_size"] == 4096 and meta["special_tokens"]["eoa"] == 157166


def test_lengths_default_to_the_layout(tmp_path, tokens):
    """A t2i sample with official tokens: prompt <user> 4 ids </user> = 6 rows; image answer 4x5 =
    BOA BOI 4*(5+1) EOI EOA = 28 rows. drop_text -> one <uncondition> instead of 4 ids; no media to drop."""
    t2i = mixed_samples()[1]
    write_samples([t2i], tmp_path, tokens)
    np.testing.assert_array_equal(ParquetSampleDataset(tmp_path).laid_out_lengths(), [[34, 31, 34, 31]])


def test_settings_mismatch_is_refused(tmp_path, tokens):
    write_samples(mixed_samples(), tmp_path, tokens, fake_length)
    with pytest.raises(ValueError, match=r"codebook_size: found 4096, expected 64"):
        ParquetSampleDataset(tmp_path, tokens.replace(codebook_size=64))
    with pytest.raises(ValueError, match=r"eoa: found 157166, expected 7"):
        ParquetSampleDataset(tmp_path, tokens.replace(eoa=7))
    other = tmp_path / "other"
    small = SpecialTokens.official(newline=NEWLINE).replace(codebook_size=64, num_codebooks=4)
    write_samples(mixed_samples(c=4, high=64), other, small, fake_length)
    with pytest.raises(ValueError, match="num_codebooks: found 4, expected 8"):
        ParquetSampleDataset([tmp_path / "shard-00000.parquet", other / "shard-00000.parquet"])
    assert ParquetSampleDataset(other).tokens == small


def test_writer_rejects_bad_samples(tmp_path, tokens):
    with ShardWriter(tmp_path, tokens, fake_length) as writer:
        bad_code = Sample("bad", [Turn("user", [Media("image", torch.full((2, 8), 4096), (1, 2))])])
        with pytest.raises(ValueError, match=r"sample 'bad': turns\[0\].parts\[0\].codes has values outside"):
            writer.write(bad_code)
        with pytest.raises(ValueError, match=r"turns\[0\].parts\[0\].ids has values outside \[0, 157184\)"):
            writer.write(Sample("t", [Turn("user", [Text([157184])])]))
        with pytest.raises(ValueError, match="role='bot'"):
            writer.write(Sample("r", [Turn("bot", [Text([1])])]))
        with pytest.raises(ValueError, match="grid"):
            writer.write(Sample("g", [Turn("user", [Media("image", codes(6, 8, 10, 0), (2, 2))])]))
        writer.write(mixed_samples()[0])
        with pytest.raises(ValueError, match="'und-0' is written twice"):
            writer.write(mixed_samples()[0])
    assert writer.num_rows == 1


def test_in_memory_dataset_matches_its_parquet_copy(tmp_path, tokens):
    ds = InMemorySampleDataset(mixed_samples(), tokens, fake_length)
    ds.save(tmp_path)
    back = ParquetSampleDataset(tmp_path, tokens)
    np.testing.assert_array_equal(back.laid_out_lengths(), ds.laid_out_lengths())
    for i in range(len(ds)):
        assert_samples_equal(back[i], ds[i])


def test_corrupt_stored_codes_name_the_shard_and_row(tmp_path, tokens):
    import pyarrow as pa

    write_samples(mixed_samples(), tmp_path, tokens, fake_length)
    path = tmp_path / "shard-00000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[1]["turns"][1]["parts"][0]["codes"] = rows[1]["turns"][1]["parts"][0]["codes"][:-1]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    ds = ParquetSampleDataset(path, tokens)
    ds[0]
    with pytest.raises(ValueError, match=r"shard-00000.parquet row 1: turns\[1\].parts\[0\] has 159 code values"):
        ds[1]


def test_negative_stored_length_names_the_shard_and_row(tmp_path, tokens):
    import pyarrow as pa

    write_samples(mixed_samples(), tmp_path, tokens, fake_length)
    path = tmp_path / "shard-00000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[2]["len_drop_image"] = -5
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    with pytest.raises(ValueError, match=r"shard-00000.parquet: row 2 has len_drop_image=-5"):
        ParquetSampleDataset(path, tokens)


def test_lengths_are_held_narrow_and_planned_wide(tmp_path, tokens):
    """The [N, 4] table in uint16 (lengths below 65,536), the per-epoch lengths in int32 (sums cannot wrap)."""
    from lumina.data.noise import NoiseConfig, cfg_dropout
    from lumina.data.sources import LayoutSource

    write_samples(mixed_samples(), tmp_path, tokens, fake_length)
    ds = ParquetSampleDataset(tmp_path, tokens)
    assert ds.laid_out_lengths().dtype == np.uint16 and ds.id_hashes().dtype == np.uint64
    assert [ds.sample_id(i) for i in range(3)] == ds.sample_ids()
    noise = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    lengths = LayoutSource(ds, noise, seed=0).lengths(0)
    coins = [cfg_dropout(0, 0, sid, noise) for sid in ds.sample_ids()]
    assert lengths.dtype == np.int32
    assert lengths.tolist() == [int(ds.laid_out_lengths()[i, dt + 2 * di]) for i, (dt, di) in enumerate(coins)]
