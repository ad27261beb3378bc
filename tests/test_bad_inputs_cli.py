"""Bad input to `lumina-generate`, `lumina-convert` and `lumina-train`: each case starts from a good input (a
tiny checkpoint, a prompts file, a picture, the built-in world's data) with one thing wrong, runs the real
console command in a subprocess, and checks the exit status (2 bad input, 1 outage), exactly one
`lumina-xxx: error:` line naming the culprit and no traceback, and every input file byte-identical afterwards.
The commands run two at a time in one module fixture (each selected case's own test then reads its result)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "data"))  # the loopback S3 server the store tests use
from s3_server import S3Server  # noqa: E402

PROMPT = "draw a large red circle at the top left ."
COMMANDS = {  # what each console script runs (pyproject's [project.scripts])
    "lumina-generate": "from lumina.cli.generate import main; main()",
    "lumina-convert": "from lumina.cli.convert import main; main()",
    "lumina-train": "from lumina.cli.train import main; main()",
}
SHARD = "model-00002-of-00007.safetensors"
BROKEN_LINE = PROMPT + '\n{"prompt": 1\n'  # line 2 is cut short


def make_checkpoint(directory: Path) -> None:
    """A tiny HF checkpoint of seven shards carrying the built-in world's tokenizer.json."""
    from lumina.checkpoint import save_pretrained
    from lumina.model import LuminaConfig, LuminaModel
    from lumina.world.dataset import world_text_tokenizer

    torch.manual_seed(0)
    save_pretrained(LuminaModel(LuminaConfig.tiny()), directory, max_shard_size="1MB")
    world_text_tokenizer().save(directory / "tokenizer.json")
    assert len(list(directory.glob("model-*.safetensors"))) == 7


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on return: nothing listens there


@dataclass
class Inputs:
    """One case's input directory: a copy of the good checkpoint (`ck`), a prompts file, a picture."""

    root: Path

    @property
    def ck(self) -> Path:
        return self.root / "ck"


@dataclass
class Case:
    id: str
    command: str
    args: Callable[[Inputs], list[str]]  # may break one input in place first
    status: int
    culprit: str  # regex the error line must match
    env: Callable[[Inputs], dict[str, str]] = field(default=lambda inputs: {})


def generate(*extra: str, task: str = "t2i", prompts: bool = True) -> list[str]:
    return [f"task={task}", *([f'prompts=["{PROMPT}"]'] if prompts else []), "image.steps=2", "text.steps=2",
            "text.gen_length=4", "text.block_length=4", *extra]


def gen_case(id: str, status: int, culprit: str, break_input: Callable[[Inputs], list[str]], **kw) -> Case:
    def args(inputs: Inputs) -> list[str]:
        extra = break_input(inputs)
        return [f"checkpoint={inputs.ck}", f"hydra.run.dir={inputs.root / 'out'}", *extra]
    return Case(id, "lumina-generate", args, status, culprit, **kw)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _no_s3fs(inputs: Inputs) -> dict[str, str]:
    """s3fs made unimportable (the `s3` extra not installed) by a package of that name that fails to import."""
    stub = inputs.root / "no_s3fs" / "s3fs"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 's3fs'\", name='s3fs')\n")
    return {"PYTHONPATH": os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")])}


def _unreachable_store(inputs: Inputs) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}", "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


GENERATE_CASES = [
    gen_case("truncated-shard", 2, rf"{SHARD}.*truncated or corrupt",
             lambda i: (truncate(i.ck / SHARD), generate())[1]),
    gen_case("shard-missing", 2, rf"shard '{SHARD}'.*does not exist",
             lambda i: ((i.ck / SHARD).unlink(), generate())[1]),
    gen_case("config-not-json", 2, r"ck/config\.json' is not valid JSON",
             lambda i: (write(i.ck / "config.json", '{"vocab_size": 512,'), generate())[1]),
    gen_case("index-not-json", 2, r"model\.safetensors\.index\.json' is not valid JSON",
             lambda i: (write(i.ck / "model.safetensors.index.json", "{"), generate())[1]),
    gen_case("no-checkpoint", 2, r"checkpoint=.*nowhere.*no config\.json",
             lambda i: generate(f"checkpoint={i.root / 'nowhere'}")),
    gen_case("device-gpu", 2, r"device='gpu': expected one of auto, cpu, cuda, cuda:N",
             lambda i: generate("device=gpu")),
    gen_case("device-cuda1x", 2, r"device='cuda1': expected one of", lambda i: generate("device=cuda1")),
    gen_case("dtype-misspelled", 2, r"dtype='float33'", lambda i: generate("dtype=float33")),
    gen_case("task-unknown", 2, r"task='paint'", lambda i: generate(task="paint")),
    gen_case("key-misspelled", 2, r"imagee\.steps", lambda i: generate("imagee.steps=2")),
    gen_case("prompts-file-broken-json", 2, r"prompts_file='.*prompts\.jsonl', line 2: not valid JSON",
             lambda i: generate(f"prompts_file={write(i.root / 'prompts.jsonl', BROKEN_LINE)}", prompts=False)),
    gen_case("prompts-file-no-prompt-key", 2, r"prompts_file='.*prompts\.jsonl', line 1: .*'prompt' key",
             lambda i: generate(f"prompts_file={write(i.root / 'prompts.jsonl', json.dumps({'text': PROMPT}))}",
                                prompts=False)),
    gen_case("prompts-file-missing", 2, r"prompts_file='.*absent\.txt': no such file",
             lambda i: generate(f"prompts_file={i.root / 'absent.txt'}", prompts=False)),
    gen_case("prompt-out-of-vocabulary", 2, r"'zebra' is not in the vocabulary",
             lambda i: ["task=t2i", 'prompts=["draw a zebra ."]', "image.steps=2"]),
    gen_case("more-images-than-prompts", 2, r"images has 2 entries for 1 inline prompts",
             lambda i: generate(f"images=[{i.root / 'red.png'},{i.root / 'red.png'}]", task="understand")),
    gen_case("image-missing", 2, r"image '.*absent\.png' does not exist",
             lambda i: generate(f"images=[{i.root / 'absent.png'}]", task="understand")),
    gen_case("image-not-an-image", 2, r"fake\.png is not a readable image",
             lambda i: generate(f"images=[{write(i.root / 'fake.png', 'not a picture')}]", task="understand")),
    gen_case("edit-without-image", 2, r"task=edit needs an image", lambda i: generate(task="edit")),
    gen_case("tokenizer-missing", 2, r"tokenizer='.*absent\.json'",
             lambda i: generate(f"tokenizer={i.root / 'absent.json'}")),
    gen_case("image-on-an-unreachable-store", 1, r"s3://bucket/red\.png: looking it up failed \d+ times",
             lambda i: generate("images=[s3://bucket/red.png]", task="understand"), env=_unreachable_store),
    gen_case("s3-extra-missing", 2, r"s3://bucket/red\.png.*pip install 'lumina\[s3\]'",
             lambda i: generate("images=[s3://bucket/red.png]", task="understand"), env=_no_s3fs),
]
if not torch.cuda.is_available():
    GENERATE_CASES.append(gen_case("device-cuda-without-gpu", 2, r"device='cuda': no CUDA device",
                                   lambda i: generate("device=cuda")))


def convert_case(id: str, culprit: str, break_input: Callable[[Inputs], list[str]], status: int = 2) -> Case:
    def args(inputs: Inputs) -> list[str]:
        extra = break_input(inputs)
        return [str(inputs.ck), str(inputs.root / "converted"), "--layout", "fused", *extra]
    return Case(id, "lumina-convert", args, status, culprit)


CONVERT_CASES = [
    convert_case("convert-truncated-shard", rf"{SHARD}.*truncated or corrupt",
                 lambda i: (truncate(i.ck / SHARD), [])[1]),
    convert_case("convert-config-not-json", r"config\.json' is not valid JSON",
                 lambda i: (write(i.ck / "config.json", "not json"), [])[1]),
    convert_case("convert-index-not-json", r"index\.json' is not valid JSON",
                 lambda i: (write(i.ck / "model.safetensors.index.json", "[1,"), [])[1]),
    convert_case("convert-shard-missing", rf"shard '{SHARD}'.*does not exist",
                 lambda i: ((i.ck / SHARD).unlink(), [])[1]),
    convert_case("convert-shard-size", r"max_shard_size='5XB'", lambda i: ["--max-shard-size", "5XB"]),
]


def train_case(id: str, status: int, culprit: str, args: Callable[[Inputs], list[str]], **kw) -> Case:
    def full(inputs: Inputs) -> list[str]:
        out = inputs.root / "run"
        return [*args(inputs), f"paths.output_dir={out}", f"hydra.run.dir={out}", "trainer.fast_dev_run=true",
                "trainer.enable_progress_bar=false", "callbacks.progress_bar=null", "logger=none"]
    return Case(id, "lumina-train", full, status, culprit, **kw)


TRAIN_CASES = [
    train_case("train-data-path-missing", 2, r"data\.sources\[0\]\.path='.*absent-shards': no such file",
               lambda i: ["data=parquet", f"data.sources.0.path={i.root / 'absent-shards'}"]),
    train_case("train-store-unreachable", 1, r"s3://bucket/shards: (listing|looking it up) failed \d+ times",
               lambda i: ["data=parquet", "data.sources.0.path=s3://bucket/shards"], env=_unreachable_store),
    train_case("train-root-without-shards", 2, r"empty-root.*(no|without) .*parquet",
               lambda i: ["data=parquet", f"data.sources.0.path={(i.root / 'empty-root').mkdir() or i.root / 'empty-root'}"]),
    train_case("train-split-without-shards", 2, r"train.*(no|without) .*parquet",
               lambda i: ["data=parquet", f"data.sources.0.path={(i.root / 'ds' / 'train').mkdir(parents=True) or i.root / 'ds'}"]),
    train_case("train-seq-len-not-an-integer", 2, r"seq_len='abc': expected int", lambda i: ["data.seq_len=abc"]),
    train_case("train-seq-len-a-float", 2, r"seq_len=1\.5: expected int", lambda i: ["data.seq_len=1.5"]),
    train_case("train-persistent-workers-not-a-bool", 2, r"persistent_workers='maybe': expected bool",
               lambda i: ["data.persistent_workers=maybe"]),
    train_case("train-source-weight-not-a-number", 2, r"weight='heavy': expected float",
               lambda i: ["data.sources.0.weight=heavy"]),
    train_case("train-key-misspelled", 2, r"data\.sourcse", lambda i: ["data.sourcse=1"]),
    train_case("train-source-weight", 2, r"weight=-1: must be positive", lambda i: ["data.sources.0.weight=-1"]),
    train_case("train-init-from-truncated-shard", 2, rf"{SHARD}.*truncated or corrupt",
               lambda i: (truncate(i.ck / SHARD), ["model=hf", f"model.init_from={i.ck}"])[1]),
]

CASES = GENERATE_CASES + CONVERT_CASES + TRAIN_CASES


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    before: dict[str, str]
    after: dict[str, str]


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """The good inputs every case copies: a tiny checkpoint and a picture of the built-in world."""
    from lumina.tokenizers.pixels import save_png
    from lumina.world.scene import ObjectSpec, render

    root = tmp_path_factory.mktemp("good")
    make_checkpoint(root / "ck")
    save_png((render(ObjectSpec("circle", "red", "large", "top left")) + 1) / 2, root / "red.png")
    return root


@pytest.fixture(scope="module")
def results(good: Path, tmp_path_factory, request) -> dict[str, Result]:
    def run(case: Case) -> Result:
        inputs = Inputs(tmp_path_factory.mktemp(case.id))
        shutil.copytree(good, inputs.root, dirs_exist_ok=True)
        args = case.args(inputs)  # the one thing wrong is made here
        env = {**os.environ, "OMP_NUM_THREADS": "1", **case.env(inputs)}
        env.pop("HYDRA_FULL_ERROR", None)
        before = digests(inputs.root)
        done = subprocess.run([sys.executable, "-c", COMMANDS[case.command], *args], cwd=inputs.root, env=env,
                              capture_output=True, text=True, timeout=240)
        after = {name: digest for name, digest in digests(inputs.root).items() if name in before}
        return Result(done.returncode, done.stdout, done.stderr, before, after)

    chosen = {item.callspec.params["case"].id for item in request.session.items
              if hasattr(item, "callspec") and isinstance(item.callspec.params.get("case"), Case)}
    cases = [case for case in CASES if case.id in chosen]  # those this session runs (-k)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([case.id for case in cases], pool.map(run, cases), strict=True))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_error_line_naming_the_culprit(case: Case, results: dict[str, Result]) -> None:
    result = results[case.id]
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"{case.command}: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert re.search(case.culprit, errors[0]), errors[0]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    assert result.returncode == case.status, result.stderr[-3000:]
    assert result.after == result.before  # nothing the user gave was changed


def test_the_good_inputs_run(good: Path, tmp_path: Path) -> None:
    """The control: the good checkpoint generates (so each case's error comes from its one mistake)."""
    shutil.copytree(good, tmp_path / "in")
    done = subprocess.run([sys.executable, "-c", COMMANDS["lumina-generate"], f"checkpoint={tmp_path / 'in' / 'ck'}",
                           f"hydra.run.dir={tmp_path / 'out'}", *generate()], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "image_0.png").is_file()


def test_a_missing_image_on_a_live_store_is_missing_not_an_outage(good: Path, tmp_path: Path) -> None:
    """Through the real S3 API (moto on loopback, as tests/data's store tests): an image object that is not there
    is a bad input (status 2) naming the URL, not an outage."""
    shutil.copytree(good, tmp_path / "in")
    before = digests(tmp_path / "in")
    server = S3Server()
    server.start()
    try:
        server.filesystem().mkdir("bucket")
        done = subprocess.run([sys.executable, "-c", COMMANDS["lumina-generate"], f"checkpoint={tmp_path / 'in' / 'ck'}",
                               f"hydra.run.dir={tmp_path / 'out'}",
                               *generate("images=[s3://bucket/gone.png]", task="understand")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=240,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **server.env})
    finally:
        server.stop()
    errors = [line for line in done.stderr.splitlines() if line.startswith("lumina-generate: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "image 's3://bucket/gone.png' does not exist" in errors[0], errors[0]
    assert done.returncode == 2
    assert digests(tmp_path / "in") == before
