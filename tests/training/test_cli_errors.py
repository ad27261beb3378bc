"""Bad configuration ends `lumina-train` with one line on stderr and a non-zero exit; the same mistakes
raise a ConfigError / ValueError naming the field when `run(cfg)` is called directly."""

from __future__ import annotations

import re

import pytest
from train_helpers import compose_train, quiet, run_cli, small_data

from lumina.cli.train import config_errors, one_line
from lumina.training.errors import ConfigError
from lumina.training.run import run


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(("args", "expected"), [
    (["experiment=no_such_experiment"], "no_such_experiment"),
    (["data.seq_len=16", *small_data()], "seq_len"),
])
def test_cli_bad_config_is_one_line(args, expected, tmp_path):
    result = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode != 0
    lines = stderr_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lumina-train: error:")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_bad_trainer_value_is_one_line_and_exit_2(tmp_path):
    result = run_cli(["trainer.max_steps=abc", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 2
    lines = stderr_lines(result)
    expected = "lumina-train: error: trainer.max_steps='abc': must be an integer >= 1"
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(("overrides", "match"), [
    (["model.config.num_codebooks=8"], r"model.config.num_codebooks=8: incompatible with the data's num_codebooks=4"),
    (["model.config.vocab_size=50", "model.config.pad_token_id=0"],
     r"model.config.vocab_size=50: incompatible with the data's text_vocab_size=91"),
    (["model.config.hidden_size=66"], r"hidden_size|channel_heads"),
    (["+model.config.no_such_field=1"], r"model.config.no_such_field: not a LuminaConfig field"),
    (["data=parquet", "data.sources.0.path=/nonexistent/shards"],
     r"data.sources\[0\].path='/nonexistent/shards': no such file or directory"),
    (["model=hf", "model.init_from=/nonexistent/hf"], r"model.init_from='/nonexistent/hf'"),
    (["model=hf"], r"model.init_from=\?\?\?: required"),
    (["model.freeze=[no_such_param.*]"], r"model.freeze='no_such_param.\*': matches no parameter"),
    (["ckpt_path=/nonexistent/last.ckpt"], r"ckpt_path='/nonexistent/last.ckpt'"),
    (["trainer.max_steps=-1", "trainer.fast_dev_run=false"], r"trainer.max_steps=-1: must be >= 1"),
    (["trainer.precision=fp8"], r"trainer.precision='fp8': must be one of"),
    (["trainer.accumulate_grad_batches=0"], r"trainer.accumulate_grad_batches=0: must be an integer >= 1"),
    (["trainer.limit_val_batches=1.5"], r"trainer.limit_val_batches=1.5: must be an integer >= 0 or a float"),
    (["trainer.gradient_clip_val=-1"], r"trainer.gradient_clip_val=-1: must be a number >= 0"),
    (["trainer.enable_progress_bar=maybe"], r"trainer.enable_progress_bar='maybe': must be true or false"),
    (["+trainer.no_such_arg=1"], r"trainer.no_such_arg: not a lightning.Trainer argument"),
])
def test_bad_config_names_the_field(overrides, match, tmp_path):
    data = [] if "data=parquet" in overrides else small_data()
    cfg = compose_train([*quiet(tmp_path), *data, "trainer.fast_dev_run=true", *overrides])  # last one wins
    with pytest.raises(config_errors()) as info:
        run(cfg)
    message = one_line(info.value)
    assert "\n" not in message
    assert re.search(match, message), message


def test_data_sample_longer_than_seq_len_is_reported_before_training(tmp_path):
    cfg = compose_train([*quiet(tmp_path), *small_data(), "data.seq_len=16"])
    with pytest.raises(ValueError, match="seq_len"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_cuda_only_config_is_refused_without_cuda(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    cfg = compose_train([*quiet(tmp_path), "experiment=flex"])
    with pytest.raises(ConfigError, match="requires_cuda=true"):
        run(cfg)
