"""Hang-proofing (every conditional module runs once, on empty rows when its modality is absent) and the
finite checks."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch
from torch import nn

from lumina.model import LuminaConfig, LuminaModel
from lumina.objective import LuminaObjective


def _calls(model: LuminaModel) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, module in model.conditional_modules().items():
        subs = list(module) if isinstance(module, nn.ModuleList) else [module]
        for i, sub in enumerate(subs):
            key = f"{name}.{i}"
            counts[key] = 0
            sub.register_forward_hook(lambda *_, key=key: counts.__setitem__(key, counts[key] + 1))
    return counts


@pytest.mark.parametrize("types", [
    [1, 1, 3, 3, 1],  # no image rows at all
    [1, 2, 2, 4, 4],  # no text answer rows
    [2, 2, 4, 4, 4],  # no word-embedded rows
])
def test_conditional_modules_run_once_and_get_zero_grads_when_unused(types: list[int]) -> None:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny())
    calls = _calls(model)
    batch = make_batch(types)
    out = model(batch)
    LuminaObjective()(out, batch).loss.backward()  # the training path: the heads run inside the objective
    assert set(calls.values()) == {1}, calls
    for name, module in model.conditional_modules().items():
        for pname, p in module.named_parameters():
            assert p.grad is not None, f"{name}.{pname} left the graph"
    heads = model.conditional_modules()
    if 3 not in types:
        assert out.text_states.shape[0] == 0 and torch.count_nonzero(heads["lm_head"].weight.grad) == 0
    if 4 not in types:
        assert out.image_states.shape[0] == 0
        for p in [*heads["multi_codebook_head"].parameters(), *heads["lm_img_head"].parameters()]:
            assert torch.count_nonzero(p.grad) == 0
    if not {2, 4} & set(types):
        assert torch.count_nonzero(heads["img_embeddings_proj"].weight.grad) == 0
    if not {0, 1, 3} & set(types):
        assert torch.count_nonzero(heads["word_embeddings"].weight.grad) == 0


@pytest.mark.parametrize(("target", "stage"), [
    ("model.word_embeddings.weight", "embeddings"),
    ("model.layers.1.attention.dense.weight", "backbone"),
    ("lm_head.weight", "text logits"),
    ("multi_codebook_head.channel_norm.bias", "channel head"),
    ("lm_img_head.2.weight", "image logits"),
])
def test_finite_checks_name_the_stage(target: str, stage: str) -> None:
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(check_finite=True))
    batch = make_batch([1, 2, 3, 3, 4, 4])
    LuminaObjective()(model(batch), batch)  # finite: no raise
    with torch.no_grad():
        dict(model.named_parameters())[target].fill_(float("inf"))
    with pytest.raises(FloatingPointError, match=stage):  # the heads' check runs in the objective's head losses
        LuminaObjective()(model(batch), batch)
    if stage.endswith("logits"):  # and when logits are asked for
        out = model(batch)
        with pytest.raises(FloatingPointError, match=stage):
            if stage == "text logits":
                out.heads.text_logits(out.text_states)
            else:
                out.heads.image_logits(out.image_states)


def test_finite_checks_off_by_default() -> None:
    model = LuminaModel(LuminaConfig.tiny())
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    out = model(make_batch([1, 3, 3]))
    assert out.heads.text_logits(out.text_states).isnan().all()
