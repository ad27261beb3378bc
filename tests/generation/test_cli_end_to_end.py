"""End to end: a 2-step `lumina-train` (with the generation-eval callback at the end), then `lumina-generate`
task=t2i, task=understand and task=eval on its HF export."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from lumina.tokenizers.pixels import save_png
from lumina.world.scene import ObjectSpec, render

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", args[0], *args[1:]], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


TRAIN = "from lumina.cli.train import main; main()"
GENERATE = "from lumina.cli.generate import main; main()"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train")
    _run([TRAIN, "experiment=debug", "trainer.max_steps=2", "logger=none", "callbacks.progress_bar=null",
          "callbacks.expert_usage=null", "trainer.enable_model_summary=false", "data.sources.0.options.num_samples=40",
          "data.sources.0.options.val_samples=8",
          "+callbacks.generation_eval._target_=lumina.world.callback.GenerationEvalCallback",
          f"+callbacks.generation_eval.dirpath={run_dir}/eval", "+callbacks.generation_eval.num_items=1",
          "+callbacks.generation_eval.every_n_steps=1",
          "+callbacks.generation_eval.image_steps=2", "+callbacks.generation_eval.text_length=4",
          "+callbacks.generation_eval.text_block=4", "+callbacks.generation_eval.text_steps=2", f"hydra.run.dir={run_dir}"], cwd=run_dir)
    return run_dir


def test_training_ran_the_evaluation_callback(trained):
    # every_n_steps=1 over 2 steps: after step 1 and step 2; the end of training does not repeat step 2
    assert sorted(p.name for p in (trained / "eval").iterdir()) == [
        "step000001.json", "step000001.png", "step000002.json", "step000002.png"]
    assert json.loads((trained / "eval" / "step000001.json").read_text())["step"] == 1
    report = json.loads((trained / "eval" / "step000002.json").read_text())
    assert report["step"] == 2
    for name in ("understand_acc", "text_qa_acc", "t2i_score", "edit_score", "edit_changed"):
        assert 0.0 <= report["metrics"][name] <= 1.0 and f"chance/{name}" in report["metrics"]
    assert Image.open(trained / "eval" / "step000002.png").size == (3 * 130, 2 * 130)  # t2i row + edit row


def test_generate_t2i(trained, tmp_path):
    out = tmp_path / "t2i"
    _run([GENERATE, "task=t2i", f"checkpoint={trained}/hf",
          'prompts=["draw a large red circle at the top left .","draw a small blue square at the middle center ."]',
          "image.steps=3", f"hydra.run.dir={out}"], cwd=tmp_path)
    lines = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [line["file"] for line in lines] == ["image_0.png", "image_1.png"]
    assert Image.open(out / "image_0.png").size == (32, 32)
    assert Image.open(out / "images.png").size == (2 * 34, 32)


def test_generate_understand(trained, tmp_path):
    picture = tmp_path / "red.png"
    save_png((render(ObjectSpec("circle", "red", "large", "top left")) + 1) / 2, picture)
    out = tmp_path / "understand"
    _run([GENERATE, "task=understand", f"checkpoint={trained}/hf",
          'prompts=["describe the image .","what colour is the shape ?"]', f"images=[{picture},{picture}]",
          "text.gen_length=8", "text.block_length=4", "text.steps=2", f"hydra.run.dir={out}"], cwd=tmp_path)
    lines = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [line["prompt"] for line in lines] == ["describe the image .", "what colour is the shape ?"]
    for line in lines:
        assert isinstance(line["answer"], str) and len(line["ids"]) <= 8 and line["image"] == str(picture)


def test_generate_rejects_words_outside_the_vocabulary(trained, tmp_path):
    from lumina.generation.run import run

    cfg = _compose(["task=t2i", f"checkpoint={trained}/hf", 'prompts=["draw a purple thing"]'], tmp_path / "bad")
    with pytest.raises(ValueError, match="'purple' is not in the vocabulary"):
        run(cfg)


def test_generate_eval_matches_the_training_callback(trained, tmp_path):
    """`task=eval` on the export, with the callback's knobs, reproduces the callback's in-training evaluation
    (same items, answers and metrics): the CLI and the callback run the same evaluation."""
    out = tmp_path / "eval"
    done = _run([GENERATE, "task=eval", "generate=world", f"checkpoint={trained}/hf", "eval.num_items=1",
                 "eval.split=val", "eval.seed=0", "by_task.edit.image.cfg_scale=1.0", "text.gen_length=4",
                 "text.block_length=4", "text.steps=2", "text.temperature=0.0", "image.steps=2",
                 "by_task.t2i.image.cfg_scale=2.0", "image.temperature=1.0", f"hydra.run.dir={out}"], cwd=tmp_path)
    report = json.loads((out / "eval.json").read_text())
    callback = json.loads((trained / "eval" / "step000002.json").read_text())
    for name in ("caption_acc", "vqa_acc", "text_qa_acc", "understand_acc", "t2i_score", "edit_score",
                 "edit_changed"):
        assert 0.0 <= report["metrics"][name] <= 1.0 and f"chance/{name}" in report["metrics"]
        assert f"{name} " in done.stdout  # printed with its chance level
    assert report["answers"] == callback["answers"]
    assert report["metrics"] == callback["metrics"]
    assert [len(report["answers"][t]) for t in ("caption", "vqa", "text_qa", "t2i", "edit")] == [1] * 5
    samples = Image.open(out / "samples.png")
    assert samples.size == (3 * 130, 2 * 130)  # t2i row + edit row, 4x upscaled
    # the generated pictures themselves (decoded codes) agree pixel for pixel
    assert samples.tobytes() == Image.open(trained / "eval" / "step000002.png").tobytes()


def _compose(overrides: list[str], output_dir):
    from hydra import compose, initialize_config_dir

    from lumina.cli.train import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("generate", overrides=overrides)
    cfg.output_dir = str(output_dir)
    return cfg


def test_generate_edit_and_text_without_an_image_decoder(trained, tmp_path):
    """A tokenizer file instead of the built-in world: no image decoder, so task=edit reads its source as a
    token file and writes raw code grids {"indices": [N, C], "coords": (0, 0, row, col, 0)}; task=text answers."""
    import torch

    from lumina.generation.run import run
    from lumina.world.dataset import world_text_tokenizer

    vocab = world_text_tokenizer().save(tmp_path / "words.json")
    source = tmp_path / "source.pt"
    config = json.loads((trained / "hf" / "config.json").read_text())
    h, w, c = 3, 2, config["num_codebooks"]
    torch.save({"indices": torch.arange(h * w * c).reshape(h * w, c) % config["codebook_size"],
                "coords": torch.tensor([[0, 0, r, k, 0] for r in range(h) for k in range(w)])}, source)
    out = run(_compose(["task=edit", f"checkpoint={trained}/hf", f"tokenizer={vocab}",
                        'prompts=["make the shape blue ."]', f"images=[{source}]", "image.steps=2",
                        "image.cfg_scale=1.0"], tmp_path / "edit"))
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["file"] == "code_0.pt" and line["grid"] == [h, w] and line["image"] == str(source)
    codes = torch.load(out / "code_0.pt")
    assert codes["indices"].shape == (h * w, c) and ((codes["indices"] >= 0) & (codes["indices"] < config["codebook_size"])).all()
    assert codes["coords"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                        [0, 0, 2, 0, 0], [0, 0, 2, 1, 0]]
    assert not (out / "images.png").exists()
    out = run(_compose(["task=text", f"checkpoint={trained}/hf", f"tokenizer={vocab}",
                        'prompts=["what is one plus two ?"]', "text.gen_length=4", "text.block_length=4",
                        "text.steps=2"], tmp_path / "text"))
    (line,) = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert line["prompt"] == "what is one plus two ?" and line["image"] is None
    assert isinstance(line["answer"], str) and len(line["ids"]) <= 4


def test_world_checkpoints_carry_their_vocabulary_and_older_ones_are_refused(trained, tmp_path):
    """The export carries the world's tokenizer.json (read back as the world); a checkpoint without one (world
    exports made before the prompt template) or with a pre-template word vocabulary is refused, naming why."""
    import shutil

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from lumina.generation.run import run
    from lumina.tokenizers.text import SPECIAL_TOKEN_STRINGS, WordTokenizer
    from lumina.world.dataset import world_text_tokenizer

    assert WordTokenizer.load(trained / "hf" / "tokenizer.json").vocab == world_text_tokenizer().vocab
    old = tmp_path / "old"
    shutil.copytree(trained / "hf", old)
    (old / "tokenizer.json").unlink()
    args = ["task=text", f"checkpoint={old}", 'prompts=["what is one plus two ?"]']
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json.*made before lumina's word vocabularies"):
        run(_compose(args, tmp_path / "a"))
    words = [*SPECIAL_TOKEN_STRINGS[:-1], *world_text_tokenizer().vocab[len(SPECIAL_TOKEN_STRINGS):]]
    Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|unk|>")).save(str(old / "tokenizer.json"))
    with pytest.raises(ValueError, match="a word vocabulary made before lumina's word vocabularies gained"):
        run(_compose(args, tmp_path / "b"))
