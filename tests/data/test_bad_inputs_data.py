"""Bad inputs to `lumina-data`: each case starts from a good input with one thing wrong and runs the real
console command in a subprocess. It must end with exactly one `lumina-data: error:` line naming the culprit,
exit status 2 (bad input) or 1 (a store outage), and leave every input file byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from pixel_helpers import write_imagefolder
from s3_server import S3Server, free_port

from lumina.cli.data import main as cli_main
from lumina.tokenizers.text import WordTokenizer

REPO = Path(__file__).resolve().parents[2]
PAD, MASK = 156892, 156895  # the official reserved ids (text)


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lumina.cli.data", *args], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def text_row(sid: str, ids: list[int]) -> dict:
    return {"id": sid, "turns": [{"role": "user", "parts": [{"kind": "text", "ids": ids}]},
                                 {"role": "assistant", "parts": [{"kind": "text", "ids": [4, 5]}]}]}


def image_row(sid: str, part: dict) -> dict:
    return {"id": sid, "turns": [{"role": "user", "parts": [{"kind": "text", "ids": [1, 2]}]},
                                 {"role": "assistant", "parts": [part]}]}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def token_file(path: Path, h: int = 2, w: int = 2, top: int = 4096, columns: int = 8) -> None:
    codes = (torch.arange(h * w * columns).reshape(h * w, columns) * 997) % top  # reaches near `top`
    coords = torch.tensor([[0, 0, r, c] for r in range(h) for c in range(w)], dtype=torch.int32)
    torch.save({"indices": codes, "coords": coords}, path)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The good inputs: a manifest with a token file, an imagefolder, its fitted image tokenizer, a tokenizer.json."""
    root = tmp_path_factory.mktemp("good")
    token_file(root / "img.pt")
    write_jsonl(root / "m.jsonl", [text_row("a", [1, 2, 3]), image_row("b", {"kind": "image", "path": "img.pt"})])
    write_imagefolder(root / "pics", 4, 20, 24, seed=1)
    assert cli_main(["fit-tokenizer", str(root / "pics"), "--out", str(root / "vq"), "--image-size", "16",
                     "--codebook-size", "8", "--codebooks", "2", "--kmeans-iters", "2"]) == 0
    WordTokenizer(["a", "red", "circle"]).save(root / "tokenizer.json")
    return root


@dataclass
class Case:
    """prepare(inputs dir, work dir) -> (argv, env); the error line must contain each of `names` (with
    `{in}` / `{work}` filled in)."""

    id: str
    prepare: Callable[[Path, Path], tuple[list[str], dict]]
    names: tuple[str, ...]
    status: int = 2


def _args(*argv: str, env: dict | None = None) -> Callable[[Path, Path], tuple[list[str], dict]]:
    def prepare(src: Path, work: Path) -> tuple[list[str], dict]:
        return [a.format(**{"in": src, "work": work}) for a in argv], env or {}
    return prepare


def _then(edit: Callable[[Path, Path], object], *argv: str, env: dict | None = None):
    def prepare(src: Path, work: Path) -> tuple[list[str], dict]:
        edit(src, work)
        return _args(*argv, env=env)(src, work)
    return prepare


def _manifest(*rows) -> Callable[[Path, Path], object]:
    return lambda src, work: write_jsonl(src / "m.jsonl", list(rows))


def _earlier_build(src: Path, work: Path) -> None:
    """A finished dataset, now part of the inputs (a refused rebuild must leave it as it was)."""
    assert cli_main(["build", str(src / "m.jsonl"), "--out", str(src / "old"), "--rows-per-shard", "1"]) == 0


def _fake_s3fs(src: Path, work: Path) -> None:
    (work / "no_s3").mkdir()
    (work / "no_s3" / "s3fs.py").write_text("raise ImportError(\"No module named 's3fs'\")\n")


def _another_models_tokenizer(src: Path, work: Path) -> None:
    """A vocabulary defining the special strings at its own ids (<|pad|> is its first word)."""
    WordTokenizer(["a", "b"]).save(src / "other.json")


CLOSED = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x",
          "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}
BUILD = ("build", "{in}/m.jsonl", "--out", "{work}/out")
FOLDER = ("build", "--imagefolder", "{in}/pics", "--image-tokenizer", "{in}/vq", "--out", "{work}/out",
          "--no-progress")

CASES = [
    # ---- outputs never overwritten or mixed ----
    Case("build-out-is-a-file", _then(lambda s, w: (w / "f").write_text("x"), "build", "{in}/m.jsonl", "--out",
                                      "{work}/f"), ("{work}/f", "existing file")),
    Case("build-out-holds-a-dataset", _then(_earlier_build, "build", "{in}/m.jsonl", "--out", "{in}/old"),
         ("{in}/old", "not empty", "shard-00000.parquet", "--overwrite")),
    Case("build-out-holds-its-input", _args("build", "{in}/m.jsonl", "--out", "{in}", "--overwrite"),
         ("holds the input", "m.jsonl")),
    Case("build-leftover-of-a-killed-run", _then(lambda s, w: (w / ".out.partial-1").mkdir(), *BUILD),
         ("{work}/.out.partial-1", "interrupted", "--overwrite")),
    Case("folder-out-not-empty", _then(lambda s, w: (w / "out").mkdir() or (w / "out" / "notes.txt").write_text(
        "mine"), *FOLDER), ("{work}/out", "notes.txt")),
    Case("world-out-not-empty", _then(lambda s, w: (w / "out").mkdir() or (w / "out" / "a.parquet").write_text(
        "x"), "world", "--out", "{work}/out", "--num-samples", "4"), ("{work}/out", "a.parquet")),
    Case("world-out-is-a-file", _then(lambda s, w: (w / "f").write_text("x"), "world", "--out", "{work}/f"),
         ("{work}/f", "existing file")),
    Case("fit-tokenizer-over-a-tokenizer", _args("fit-tokenizer", "{in}/pics", "--out", "{in}/vq"),
         ("{in}/vq", "not empty")),
    Case("fit-tokenizer-out-is-a-file", _args("fit-tokenizer", "{in}/pics", "--out", "{in}/m.jsonl"),
         ("m.jsonl", "existing file")),
    Case("tokenize-over-a-token-file", _then(lambda s, w: (s / "t").mkdir() or token_file(s / "t" / "002.pkl", top=8, columns=2),
                                             "tokenize-images", "{in}/pics", "--out", "{in}/t", "--image-tokenizer",
                                             "{in}/vq"), ("{in}/t/002.pkl", "--resume")),
    Case("tokenize-resume-over-a-corrupt-file", _then(
        lambda s, w: (w / "t").mkdir() or (w / "t" / "000.pkl").write_bytes(b"not a pickle"),
        "tokenize-images", "{in}/pics", "--out", "{work}/t", "--image-tokenizer", "{in}/vq", "--resume"),
        ("{work}/t/000.pkl", "--resume")),
    Case("tokenize-out-is-a-file", _args("tokenize-images", "{in}/pics", "--out", "{in}/m.jsonl",
                                         "--image-tokenizer", "{in}/vq"), ("m.jsonl", "existing file")),
    # ---- store errors are store errors ----
    Case("manifest-on-an-unreachable-store", _args("build", "s3://bucket/m.jsonl", "--out", "{work}/out",
                                                   env=CLOSED), ("s3://bucket/m.jsonl", "failed"), status=1),
    Case("skip-never-skips-an-outage", _then(_manifest(image_row("s3", {"kind": "image", "path":
                                                                       "s3://bucket/img.pt"})),
                                             *BUILD, "--on-error", "skip", env=CLOSED),
         ("s3://bucket/img.pt", "failed"), status=1),
    Case("info-on-an-unreachable-store", _args("info", "s3://bucket/shards", env=CLOSED),
         ("s3://bucket/shards", "failed"), status=1),
    Case("s3-extra-missing", _then(_fake_s3fs, "build", "s3://bucket/m.jsonl", "--out", "{work}/out",
                                   env={"PYTHONPATH": f"{REPO}:" + "{work}/no_s3"}),
         ("s3://bucket/m.jsonl", "pip install 'lumina[s3]'")),
    # ---- checks training would run, at build time ----
    Case("reserved-pad-id-in-text", _then(_manifest(text_row("a", [1, PAD])), *BUILD),
         ("m.jsonl:1", "reserves")),
    Case("reserved-mask-id-in-text", _then(_manifest(text_row("a", [1]), text_row("b", [MASK])), *BUILD),
         ("m.jsonl:2", "reserves")),
    Case("another-models-tokenizer", _then(_another_models_tokenizer, *BUILD, "--tokenizer", "{in}/other.json"),
         ("'<|pad|>'", "id 0", "156892")),
    Case("tokenizer-not-a-tokenizer-json", _args(*BUILD, "--tokenizer", "{in}/m.jsonl"),
         ("tokenizer file", "m.jsonl")),
    Case("tokenizer-missing", _args(*BUILD, "--tokenizer", "{in}/none.json"), ("{in}/none.json",)),
    Case("inline-code-outside-the-codebook", _then(_manifest(image_row("c", {"kind": "image", "codes": [[4096] * 8],
                                                                           "grid": [1, 1]})), *BUILD),
         ("m.jsonl:1", "4096")),
    Case("token-file-code-outside-the-codebook", _then(lambda s, w: token_file(s / "img.pt", top=5000), *BUILD),
         ("m.jsonl:2", "img.pt")),
    Case("image-codes-for-another-codebook", _args(*BUILD, "--codebook-size", "64"), ("m.jsonl:2", "img.pt")),
    # ---- nothing dropped without an error ----
    Case("misspelled-row-key", _then(_manifest({**text_row("a", [1]), "sorce": "web"}), *BUILD),
         ("m.jsonl:1", "'sorce'")),
    Case("misspelled-turn-key", _then(_manifest({"id": "a", "turns": [
        {"role": "user", "parts": [{"kind": "text", "ids": [1]}], "rol": "x"},
        {"role": "assistant", "parts": [{"kind": "text", "ids": [2]}]}]}), *BUILD), ("m.jsonl:1", "'rol'")),
    Case("misspelled-part-key", _then(_manifest(image_row("b", {"kind": "image", "path": "img.pt", "gird": [2, 2]})),
                                      *BUILD), ("m.jsonl:1", "'gird'")),
    Case("empty-manifest", _then(lambda s, w: (s / "m.jsonl").write_text(""), *BUILD), ("{in}/m.jsonl", "no rows")),
    Case("blank-manifest", _then(lambda s, w: (s / "m.jsonl").write_text("\n \n"), *BUILD), ("m.jsonl", "no rows")),
    Case("manifest-missing", _args("build", "{in}/none.jsonl", "--out", "{work}/out"), ("{in}/none.jsonl",)),
    Case("manifest-bad-json", _then(_manifest(text_row("a", [1]), "{oops"), *BUILD), ("m.jsonl:2", "JSON")),
    Case("folder-train-and-top-level-metadata", _then(
        lambda s, w: write_imagefolder(s / "pics" / "train", 2, 20, 24, seed=3), *FOLDER),
        ("{in}/pics/metadata.jsonl", "train")),
    Case("folder-two-held-out-splits", _then(
        lambda s, w: [write_imagefolder(s / "hf" / d, 2, 20, 24, seed=4) for d in ("train", "val", "valid")],
        *FOLDER[:2], "{in}/hf", *FOLDER[3:]), ("val/", "valid/")),
    Case("folder-empty-metadata", _then(lambda s, w: (s / "pics" / "metadata.jsonl").write_text(""), *FOLDER),
         ("metadata.jsonl", "no rows")),
    Case("folder-line-without-text", _then(lambda s, w: write_jsonl(s / "pics" / "metadata.jsonl", [
        {"file_name": "000.png", "text": "x"}, {"file_name": "001.png"}]), *FOLDER),
        ("metadata.jsonl:2", "'text'")),
    Case("folder-image-missing", _then(lambda s, w: write_jsonl(s / "pics" / "metadata.jsonl", [
        {"file_name": "gone.png", "text": "x"}]), *FOLDER), ("metadata.jsonl:1", "gone.png")),
    Case("folder-without-image-tokenizer", _args("build", "--imagefolder", "{in}/pics", "--out", "{work}/out"),
         ("--image-tokenizer",)),
    Case("tokenize-missing-image", _args("tokenize-images", "{in}/none.png", "--out", "{work}/t",
                                         "--image-tokenizer", "{in}/vq"), ("{in}/none.png",)),
    Case("tokenize-colliding-stems", _then(lambda s, w: shutil.copy(s / "pics" / "000.png", s / "000.png"),
                                           "tokenize-images", "{in}/pics", "{in}/000.png", "--out", "{work}/t",
                                           "--image-tokenizer", "{in}/vq"), ("000",)),
    Case("fit-tokenizer-missing-image", _args("fit-tokenizer", "{in}/none.png", "--out", "{work}/vq"),
         ("{in}/none.png",)),
    Case("info-missing-path", _args("info", "{in}/none"), ("{in}/none",)),
    Case("info-directory-without-shards", _args("info", "{in}/pics"), ("{in}/pics", "parquet")),
]


@dataclass
class Outcome:
    src: Path
    work: Path
    result: subprocess.CompletedProcess
    before: dict[str, str]
    after: dict[str, str]


@pytest.fixture(scope="module")
def outcomes(template, tmp_path_factory, request) -> dict[str, Outcome]:
    """Every selected case run once, a few at a time (each is mostly a subprocess starting up)."""
    def run(case: Case) -> Outcome:
        root = tmp_path_factory.mktemp(case.id)
        src, work = root / "in", root / "work"
        shutil.copytree(template, src)
        work.mkdir()
        argv, env = case.prepare(src, work)
        env = {k: v.format(**{"in": src, "work": work}) for k, v in env.items()}
        before = digests(src)
        result = run_cli(*argv, env=env)
        return Outcome(src, work, result, before, digests(src))

    chosen = {item.callspec.params["case"].id for item in request.session.items
              if hasattr(item, "callspec") and isinstance(item.callspec.params.get("case"), Case)}
    cases = [c for c in CASES if c.id in chosen]
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        return dict(zip([c.id for c in cases], pool.map(run, cases), strict=True))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_one_line_naming_it_and_changes_no_input(case, outcomes):
    out = outcomes[case.id]
    result, fill = out.result, {"in": out.src, "work": out.work}
    errors = [line for line in result.stderr.splitlines() if line.startswith("lumina-data: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for name in case.names:
        assert name.format(**fill) in errors[0], errors[0]
    assert result.returncode == case.status, result.stderr[-2000:]
    assert out.after == out.before
    assert not (out.work / "out").exists() or case.id.endswith("not-empty")  # no half-written output


def test_a_missing_object_on_a_live_store_is_missing_not_an_outage(template, tmp_path):
    """Through the real S3 API (moto on loopback): not found is a bad input (2), naming the URL."""
    server = S3Server()
    server.start()
    try:
        fs = server.filesystem()
        fs.mkdir("bucket")
        fs.pipe("bucket/m.jsonl", json.dumps(image_row("b", {"kind": "image", "path": "gone.pt"})).encode() + b"\n")
        result = run_cli("build", "s3://bucket/m.jsonl", "--out", str(tmp_path / "out"), env=server.env)
        missing = run_cli("build", "s3://bucket/none.jsonl", "--out", str(tmp_path / "out"), env=server.env)
    finally:
        server.stop()
    assert result.returncode == 2 and "s3://bucket/gone.pt does not exist" in result.stderr, result.stderr
    assert missing.returncode == 2 and "s3://bucket/none.jsonl does not exist" in missing.stderr, missing.stderr


def test_a_killed_build_leaves_no_partial_dataset(tmp_path):
    manifest = write_jsonl(tmp_path / "m.jsonl", [text_row(f"r{i}", [1 + i % 50, 2]) for i in range(40000)])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "lumina.cli.data", "build", str(manifest), "--out", str(out),
                             "--rows-per-shard", "50"], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.partial-*/shard-00001.parquet")):  # shards are being written
        assert proc.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    again = run_cli("build", str(manifest), "--out", str(out))
    assert again.returncode == 2 and ".out.partial-" in again.stderr and not out.exists(), again.stderr
    write_jsonl(manifest, [text_row("only", [1])])
    assert run_cli("build", str(manifest), "--out", str(out), "--overwrite").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "out"]


def test_overwrite_leaves_no_stale_shard(template, tmp_path):
    manifest = shutil.copy(template / "m.jsonl", tmp_path / "m.jsonl")
    shutil.copy(template / "img.pt", tmp_path / "img.pt")
    out = tmp_path / "out"
    assert run_cli("build", str(manifest), "--out", str(out), "--rows-per-shard", "1").returncode == 0
    assert sorted(p.name for p in out.glob("*.parquet")) == ["shard-00000.parquet", "shard-00001.parquet"]
    write_jsonl(manifest, [text_row("new", [7])])
    result = run_cli("build", str(manifest), "--out", str(out), "--overwrite")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.parquet")) == ["shard-00000.parquet"]
    assert json.loads((out / "build_report.json").read_text())["rows_written"] == 1
    info = json.loads(run_cli("info", str(out)).stdout)
    assert info["rows"] == 1


def test_tokenize_resume_keeps_finished_files_and_writes_the_rest(template, tmp_path):
    out = tmp_path / "t"
    args = ("tokenize-images", str(template / "pics"), "--out", str(out), "--image-tokenizer", str(template / "vq"))
    assert run_cli(*args).returncode == 0
    (out / "001.pkl").unlink()
    kept = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("*.pkl")}
    result = run_cli(*args, "--resume")
    assert result.returncode == 0 and "3 token files kept, 1 to write" in result.stdout, result.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("*.pkl") if p.name in kept} == kept
    assert (out / "001.pkl").is_file()


def test_imagefolder_extra_columns_are_counted_and_valid_is_the_held_out_split(template, tmp_path):
    for split, seed in (("train", 5), ("valid", 6)):
        lines = write_imagefolder(tmp_path / "hf" / split, 2, 20, 24, seed=seed)
        write_jsonl(tmp_path / "hf" / split / "metadata.jsonl", [{**line, "license": "cc0"} for line in lines])
    (tmp_path / "hf" / "test").mkdir()
    result = run_cli("build", "--imagefolder", str(tmp_path / "hf"), "--image-tokenizer", str(template / "vq"),
                     "--out", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "metadata keys not used: license (2 lines)" in result.stdout
    for split in ("train", "val"):
        report = json.loads((tmp_path / "out" / split / "build_report.json").read_text())
        assert report["ignored_keys"] == {"license": 2} and report["rows_written"] == 4
