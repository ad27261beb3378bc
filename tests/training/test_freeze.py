"""`model.freeze`: frozen parameters get no gradient and stay out of the optimizer; `mark_trainable` returns
the rest."""

import pytest

from lumina.model import LuminaConfig, LuminaModel
from lumina.training.errors import ConfigError
from lumina.training.freeze import freeze_parameters
from lumina.training.optim import OptimConfig, build_optimizer
from lumina.training.trainable import mark_trainable


def test_freeze_globs_select_by_name_and_leave_the_optimizer():
    model = LuminaModel(LuminaConfig.tiny())
    frozen = freeze_parameters(model, ["model.word_embeddings.*", "lm_img_head.*"])
    assert frozen == ["model.word_embeddings.weight"] + [f"lm_img_head.{c}.weight" for c in range(4)]
    for name, param in model.named_parameters():
        assert param.requires_grad == (name not in frozen)
    optimizer = build_optimizer(model, OptimConfig())
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert not in_optimizer & {id(params[n]) for n in frozen}
    assert len(in_optimizer) == len(params) - len(frozen)


def test_glob_matching_nothing_is_an_error():
    model = LuminaModel(LuminaConfig.tiny())
    with pytest.raises(ConfigError, match=r"model.freeze='model.word_embedding\.\*'"):
        freeze_parameters(model, ["model.word_embedding.*"])


def test_freezing_everything_is_an_error():
    model = LuminaModel(LuminaConfig.tiny())
    freeze_parameters(model, ["*"])
    with pytest.raises(ConfigError, match="no trainable parameter"):
        build_optimizer(model, OptimConfig())


def test_mark_trainable_returns_what_is_left_after_the_globs():
    model = LuminaModel(LuminaConfig.tiny())
    names = [name for name, _ in model.named_parameters()]
    trainable = mark_trainable(model, ["*.mlp.experts.*"])
    experts = [n for n in names if ".mlp.experts." in n]
    assert experts and list(trainable) == [n for n in names if n not in experts]
    assert all(trainable[n] is p for n, p in model.named_parameters() if n in trainable)
    assert not any(p.requires_grad for n, p in model.named_parameters() if n in experts)
