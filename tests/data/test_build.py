"""`lumina-data build`: official token files + JSONL manifests -> shards; every bad row names file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sample_helpers import codes

from lumina.cli.data import main as cli_main
from lumina.data.storage import ParquetSampleDataset
from lumina.ingest.build_shards import BuildError, build_shards
from lumina.tokenizers.text import WordTokenizer, special_tokens_of


def image_coords(h: int, w: int, columns: int = 5) -> torch.Tensor:
    """(batch, time, row, col, 0) in row-major order, written out by hand-style loops."""
    rows = [[0, 0, r, c, 0][:columns] for r in range(h) for c in range(w)]
    return torch.tensor(rows, dtype=torch.int32)


def save_tokens(path: Path, indices: torch.Tensor, coords: torch.Tensor) -> str:
    torch.save({"indices": indices, "coords": coords}, path)
    return path.name


def write_manifest(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def t2i_row(sid: str, image_part: dict) -> dict:
    return {"id": sid, "turns": [{"role": "user", "parts": [{"kind": "text", "ids": [1, 2, 3]}]},
                                 {"role": "assistant", "parts": [image_part]}]}


def test_token_file_import_round_trip(tmp_path, tokens):
    img = codes(6, 8, 4096, 0)
    video = codes(2 * 2 * 3, 8, 4096, 1)
    mesh = codes(2 * 3 * 2, 8, 4096, 2)
    save_tokens(tmp_path / "img.pt", img, image_coords(2, 3))
    save_tokens(tmp_path / "img4.pt", img, image_coords(2, 3, columns=4))
    # video (batch, t, x, y, z) ordered t, y, x; grid (t=2, h=2, w=3)
    save_tokens(tmp_path / "vid.pt", video, torch.tensor([[0, t, x, y, 0] for t in range(2) for y in range(2)
                                                          for x in range(3)]))
    # mesh3d (x, y, z) ordered z, y, x; grid (z=2, y=3, x=2)
    save_tokens(tmp_path / "mesh.pt", mesh, torch.tensor([[x, y, z] for z in range(2) for y in range(3)
                                                          for x in range(2)]))
    und = {"id": "und", "source": "mine", "turns": [
        {"role": "user", "parts": [{"kind": "image", "path": "img.pt"}, {"kind": "text", "ids": [7, 8]},
                                   {"kind": "video", "path": "vid.pt"}, {"kind": "mesh3d", "path": "mesh.pt"}]},
        {"role": "assistant", "parts": [{"kind": "text", "ids": [9]}]}]}
    inline = t2i_row("inline", {"kind": "image", "codes": img.tolist(), "grid": [2, 3]})
    manifest = write_manifest(tmp_path / "m.jsonl", [und, "", t2i_row("t2i", {"kind": "image", "path": "img4.pt",
                                                                          "grid": [2, 3]}), inline])
    report = build_shards([manifest], tmp_path / "out", tokens)
    assert (report.rows_written, report.rows_skipped) == (3, 0)
    ds = ParquetSampleDataset(tmp_path / "out", tokens)
    assert ds.sample_ids() == ["und", "t2i", "inline"]
    image, text, vid, msh = ds[0].turns[0].parts
    assert ds[0].source == "mine" and ds[1].source == "default"
    assert torch.equal(image.codes, img) and image.grid == (2, 3) and text.ids == [7, 8]
    assert torch.equal(vid.codes, video) and vid.grid == (2, 2, 3)
    assert torch.equal(msh.codes, mesh) and msh.grid == (2, 3, 2)
    assert torch.equal(ds[1].turns[1].parts[0].codes, img) and torch.equal(ds[2].turns[1].parts[0].codes, img)
    assert json.loads((tmp_path / "out" / "build_report.json").read_text())["rows_written"] == 3


BAD_ROWS = {
    "out of range": ("big.pt", r"big.pt: image indices must lie in \[0, 4096\), got min=\d+, max=4096"),
    "n mismatch": ("short.pt", r"coords has 5 rows but spans the grid \(2, 3\)"),
    "column order": ("colmajor.pt", r"not in row-major order of grid \(2, 3\).*row 1 is \[0, 0, 1, 0, 0\]"),
    "wrong C": ("c4.pt", r"image indices must have 8 columns, got shape \[6, 4\]"),
    "missing file": ("nope.pt", r"token file .*nope.pt does not exist"),
    "pickle": ("pickle.pt", r"pickle.pt cannot be read safely"),
}


def bad_token_files(tmp_path: Path) -> None:
    good = codes(6, 8, 4096, 0)
    save_tokens(tmp_path / "big.pt", good.clone().index_put_((torch.tensor([4]), torch.tensor([2])),
                                                             torch.tensor(4096)), image_coords(2, 3))
    save_tokens(tmp_path / "short.pt", good[:5], image_coords(2, 3)[:5])
    save_tokens(tmp_path / "colmajor.pt", good, torch.tensor([[0, 0, r, c, 0] for c in range(3) for r in range(2)]))
    save_tokens(tmp_path / "c4.pt", good[:, :4], image_coords(2, 3))
    torch.save({"indices": good, "coords": image_coords(2, 3), "extra": Path("x")}, tmp_path / "pickle.pt")


def test_each_bad_token_file_names_manifest_line_and_file(tmp_path, tokens):
    bad_token_files(tmp_path)
    for name, (filename, pattern) in BAD_ROWS.items():
        manifest = write_manifest(tmp_path / "m.jsonl", [t2i_row("ok", {"kind": "text", "ids": [4]}),
                                                         t2i_row(name, {"kind": "image", "path": filename})])
        with pytest.raises(BuildError, match=rf"m.jsonl:2: .*{pattern}"):
            build_shards([manifest], tmp_path / "out", tokens)


@pytest.mark.parametrize(("row", "pattern"), [
    ("{not json", "invalid JSON"),
    ({"turns": []}, "missing field 'id'"),
    ({"id": "x"}, "missing field 'turns'"),
    ({"id": "x", "turns": [{"role": "bot", "parts": []}]}, r"turns\[0\].role='bot'"),
    ({"id": "x", "turns": [{"role": "user"}]}, r"turns\[0\]: missing field 'parts'"),
    (t2i_row("x", {"kind": "image", "codes": [[1] * 8] * 5, "grid": [2, 3]}), "5 cells but grid"),
    (t2i_row("x", {"kind": "image", "codes": [[1] * 8] * 6}), "inline codes need a 'grid'"),
    (t2i_row("x", {"kind": "audio", "path": "a.pt"}), "kind='audio'"),
    (t2i_row("x", {"kind": "text", "text": "hello"}), "needs a tokenizer"),
    (t2i_row("x", {"kind": "text", "ids": [157184]}), r"outside \[0, 157184\)"),
    ({"id": "x", "turns": [{"role": "user", "parts": [{"kind": "text", "ids": [1]}]}]}, "no assistant answer"),
])
def test_bad_rows_raise_with_file_and_line(tmp_path, tokens, row, pattern):
    manifest = write_manifest(tmp_path / "rows.jsonl", [t2i_row("first", {"kind": "text", "ids": [4]}), "", row])
    with pytest.raises(BuildError, match=rf"rows.jsonl:3: .*{pattern}"):
        build_shards([manifest], tmp_path / "out", tokens)


def test_skip_policy_counts_and_reports_every_bad_row(tmp_path, tokens):
    bad_token_files(tmp_path)
    rows = [t2i_row("good-0", {"kind": "text", "ids": [4]})]
    rows += [t2i_row(f"bad-{i}", {"kind": "image", "path": f}) for i, (f, _) in enumerate(BAD_ROWS.values())]
    rows += [t2i_row("good-0", {"kind": "text", "ids": [5]}), t2i_row("good-1", {"kind": "text", "ids": [6]})]
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    report = build_shards([manifest], tmp_path / "out", tokens, on_error="skip")
    assert report.rows_written == 2 and report.rows_skipped == len(BAD_ROWS) + 1
    assert [s.line for s in report.skipped] == list(range(2, len(BAD_ROWS) + 3))
    assert "'good-0' is written twice" in report.skipped[-1].reason
    assert ParquetSampleDataset(tmp_path / "out").sample_ids() == ["good-0", "good-1"]
    saved = json.loads((tmp_path / "out" / "build_report.json").read_text())
    assert saved["rows_skipped"] == len(BAD_ROWS) + 1 and saved["skipped"][0]["line"] == 2


def test_text_strings_use_the_tokenizer(tmp_path):
    tok = WordTokenizer(["draw", "a", "red", "square", "yes"])
    tokens = special_tokens_of(tok, codebook_size=16, num_codebooks=2)
    row = {"id": "s", "turns": [{"role": "user", "parts": [{"kind": "text", "text": "draw a red square"}]},
                                {"role": "assistant", "parts": [{"kind": "text", "text": "yes"}]}]}
    manifest = write_manifest(tmp_path / "m.jsonl", [row, {**row, "id": "s2", "turns": [
        {"role": "user", "parts": [{"kind": "text", "text": "draw a blue square"}]}, row["turns"][1]]}])
    report = build_shards([manifest], tmp_path / "out", tokens, tokenizer=tok, on_error="skip")
    assert report.rows_written == 1
    assert "m.jsonl" in report.skipped[0].manifest and "'blue' is not in the vocabulary" in report.skipped[0].reason
    sample = ParquetSampleDataset(tmp_path / "out", tokens)[0]
    assert tok.decode(sample.turns[0].parts[0].ids) == "draw a red square"


def test_cli_build_reports_and_fails_with_one_line(tmp_path, capsys):
    save_tokens(tmp_path / "img.pt", codes(6, 8, 4096, 0), image_coords(2, 3))
    rows = [t2i_row("a", {"kind": "image", "path": "img.pt"}), t2i_row("b", {"kind": "image", "path": "gone.pt"})]
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    assert cli_main(["build", str(manifest), "--out", str(tmp_path / "o1"), "--on-error", "skip"]) == 0
    out = capsys.readouterr()
    assert "wrote 1 rows to 1 shards" in out.out and "skipped 1 rows" in out.out
    assert "m.jsonl:2:" in out.err and "gone.pt does not exist" in out.err
    assert cli_main(["build", str(manifest), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "m.jsonl:2:" in err
    assert cli_main(["info", str(tmp_path / "o1")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 1
