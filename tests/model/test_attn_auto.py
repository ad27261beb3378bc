"""`attn_backend: auto` (the default): resolved once when the model is built, logged, and kept in the config."""

from __future__ import annotations

import logging

import pytest
import torch
from model_helpers import MIXED_TYPES, make_batch

from lumina.attention import BACKENDS, Backend, Pairs, resolve_backend
from lumina.attention.backends import flash_varlen
from lumina.attention.rules import Rows
from lumina.attention.rules.full import FullRules
from lumina.checkpoint import save_pretrained
from lumina.checkpoint.model_factory import build_model
from lumina.model import LuminaConfig, LuminaModel

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="auto means segmented only without CUDA")


def test_explicit_names_are_returned_unchanged() -> None:
    names = BACKENDS.names()
    assert set(names) == {"sdpa_dense", "segmented", "flex", "flash_varlen"}  # found by scanning the package
    assert [resolve_backend(name) for name in names] == list(names)


@no_cuda
def test_auto_is_segmented_without_cuda() -> None:
    assert resolve_backend("auto") == "segmented"


def test_auto_on_cuda_prefers_flash_attn_then_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flash_varlen, "flash_attn_varlen_func", None)  # flash-attn did not import
    assert resolve_backend("auto") == "flex"
    monkeypatch.setattr(flash_varlen, "flash_attn_varlen_func", object())  # it did
    assert resolve_backend("auto") == "flash_varlen"


def test_unknown_names_raise_naming_the_value() -> None:
    choices = "choose one of flash_varlen, flex, sdpa_dense, segmented"
    with pytest.raises(ValueError, match=f"attn_backend='xformers': no attention backend of that name; {choices}"):
        resolve_backend("xformers")
    with pytest.raises(ValueError, match=f"LuminaConfig.attn_backend='Auto': .*{choices}"):
        LuminaConfig.tiny(attn_backend="Auto")
    with pytest.raises(ValueError, match="LuminaConfig.attn_rule='R1-R8': .*choose one of full, simple"):
        LuminaConfig.tiny(attn_rule="R1-R8")
    with pytest.raises(ValueError, match="LuminaConfig.attn_backend='my_pkg.Attention': cannot import module"):
        LuminaConfig.tiny(attn_backend="my_pkg.Attention")


@no_cuda
def test_default_model_runs_segmented_and_equals_an_explicit_segmented_model(attend_calls) -> None:
    torch.manual_seed(0)
    auto = LuminaModel(LuminaConfig.tiny())
    explicit = LuminaModel(LuminaConfig.tiny(attn_backend="segmented"))
    explicit.load_state_dict(auto.state_dict())
    assert auto.config.attn_backend == "auto"  # the config keeps "auto" (it round-trips) ...
    assert auto.model.attn_backend == "segmented"  # ... the model holds what it resolved to
    batch = make_batch(MIXED_TYPES, seed=3)

    attend_calls.clear()
    with torch.no_grad():
        out = auto(batch)
    assert dict(attend_calls) == {"segmented": auto.config.num_hidden_layers}
    with torch.no_grad():
        ref = explicit(batch)
    assert torch.equal(out.hidden, ref.hidden)
    assert torch.equal(out.heads.text_logits(out.text_states), ref.heads.text_logits(ref.text_states))
    assert torch.equal(out.heads.image_logits(out.image_states), ref.heads.image_logits(ref.image_states))


@no_cuda
def test_the_chosen_backend_is_logged_once_per_build(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lumina"):
        LuminaModel(LuminaConfig.tiny())
        LuminaModel(LuminaConfig.tiny(attn_backend="sdpa_dense"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention backend:")]
    assert lines == ["attention backend: segmented (attn_backend=auto)",
                     "attention backend: sdpa_dense (attn_backend=sdpa_dense)"]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in lines)


class PlainMath(Backend):
    """A backend of the user's own, in one class: softmax(q k^T / sqrt(hd) + mask) v written out, counted as
    dense pairs."""

    name = "plain_math"
    pairs = Pairs.DENSE

    @staticmethod
    def forward(q, k, v, spec):
        allowed = spec.allowed(slice(None), slice(None))[:, None]  # [1, 1, Lq, Lk]
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(scores.masked_fill(~allowed, torch.finfo(q.dtype).min), dim=-1) @ v


def test_a_backend_of_ones_own_by_dotted_path(attend_calls) -> None:
    """One class, named in the config: the model runs it (the hook sees it serve every layer), its output
    equals sdpa_dense's, and the FLOP count follows its declared pairs."""
    from lumina.model.flops import attention_pairs

    path = f"{__name__}.PlainMath"
    torch.manual_seed(0)
    mine = LuminaModel(LuminaConfig.tiny(attn_backend=path))
    dense = LuminaModel(LuminaConfig.tiny(attn_backend="sdpa_dense"))
    dense.load_state_dict(mine.state_dict())
    batch = make_batch(MIXED_TYPES, seed=3)
    with torch.no_grad():
        out, ref = mine(batch), dense(batch)
    assert dict(attend_calls) == {path: mine.config.num_hidden_layers, "sdpa_dense": dense.config.num_hidden_layers}
    torch.testing.assert_close(out.hidden, ref.hidden, atol=1e-5, rtol=1e-5)
    assert attention_pairs(batch, path) == attention_pairs(batch, "sdpa_dense") == batch.seq_len ** 2


def test_the_config_names_the_attention_rule() -> None:
    """attn_rule reaches the model's spec: on a pack with block ids, auto is the official full rules, and
    forcing the simple rules changes the output."""
    batch = make_batch(MIXED_TYPES, seed=3, clean=False)
    batch.block_ids[0, 5:] = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1])  # the answer rows' blocks
    outs = {}
    for rule in ("auto", "full", "simple"):
        torch.manual_seed(0)
        model = LuminaModel(LuminaConfig.tiny(attn_rule=rule))
        with torch.no_grad():
            outs[rule] = model(batch).hidden
    assert torch.equal(outs["auto"], outs["full"])
    assert not torch.allclose(outs["auto"], outs["simple"], atol=1e-3)


class EveryPairRule(FullRules):
    """A rule of a user's own: every pair of a sequence may attend (no block-diffusion restrictions)."""

    def allow(self, q: Rows, k: Rows) -> torch.Tensor:
        return torch.ones(torch.broadcast_shapes(q.turn.shape, k.turn.shape), dtype=torch.bool)


def test_the_attention_rule_travels_with_the_checkpoint(tmp_path) -> None:
    """attn_rule is written to config.json and read back; the official split layout holds the official rules
    (auto, full, simple) and refuses a rule of one's own, naming it; lumina's fused layout keeps it."""
    for rule in ("auto", "full", "simple"):
        model = LuminaModel(LuminaConfig.tiny(attn_rule=rule))
        save_pretrained(model, tmp_path / rule, layout="split")
        assert LuminaConfig.from_hf(tmp_path / rule).attn_rule == rule
    own = f"{__name__}.EveryPairRule"
    model = LuminaModel(LuminaConfig.tiny(attn_rule=own))
    with pytest.raises(ValueError, match=rf"layout='split'.*attn_rule='{own}'"):
        save_pretrained(model, tmp_path / "own_split", layout="split")
    save_pretrained(model, tmp_path / "own", layout="fused")
    back = build_model(LuminaConfig.from_hf(tmp_path / "own"), init_from=tmp_path / "own")
    batch = make_batch(MIXED_TYPES, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(back(batch).hidden, model(batch).hidden)
    assert back.config.attn_rule == own
