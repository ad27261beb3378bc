"""Streaming load into a meta-initialised model equals the source model, tensor for tensor and in forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_bit_equal, seeded_model, small_batch

from lumina.checkpoint import load_hf_state_dict_into, load_pretrained, materialise_leftovers, save_pretrained
from lumina.model import LuminaModel


def forward_outputs(model: LuminaModel, config) -> dict[str, torch.Tensor]:
    out = model(small_batch(config))
    tensors = {"hidden": out.hidden, "text_logits": out.heads.text_logits(out.text_states),
               "image_logits": out.heads.image_logits(out.image_states),
               "text_rows": out.text_rows, "image_rows": out.image_rows}
    for i, (logits, ids) in enumerate(zip(out.router_logits, out.router_topk_ids, strict=True)):
        tensors[f"router_logits.{i}"], tensors[f"topk.{i}"] = logits, ids
    return tensors


@pytest.mark.parametrize("layout", ["split", "fused"])
def test_meta_model_load_equals_source(fp32_model: LuminaModel, tmp_path: Path, layout: str) -> None:
    save_pretrained(fp32_model, tmp_path, layout=layout, max_shard_size="500KB")
    with torch.device("meta"):
        model = LuminaModel(fp32_model.config)
    load_hf_state_dict_into(model, tmp_path)
    on_meta = sorted(name for name, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta)
    assert on_meta == ["model.rotary_emb.inv_freq"]  # exactly the non-persistent buffers
    materialise_leftovers(model)
    assert_bit_equal(model.state_dict(), fp32_model.state_dict())
    assert torch.equal(model.model.rotary_emb.inv_freq, fp32_model.model.rotary_emb.inv_freq)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in model.parameters())
    experts = model.model.layers[1].mlp.experts.gate_proj
    assert experts.is_contiguous() and experts.untyped_storage().nbytes() == experts.numel() * 4
    with torch.no_grad():
        got, want = forward_outputs(model, fp32_model.config), forward_outputs(fp32_model, fp32_model.config)
    assert_bit_equal(got, want)


def test_bf16_checkpoint_into_meta_model_keeps_dtypes(bf16_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(bf16_model, tmp_path)
    with torch.device("meta"):
        model = LuminaModel(bf16_model.config)  # meta tensors are fp32; the checkpoint's bf16 wins
    load_hf_state_dict_into(model, tmp_path)
    materialise_leftovers(model)
    assert_bit_equal(model.state_dict(), bf16_model.state_dict())
    with torch.no_grad():
        assert_bit_equal(forward_outputs(model, bf16_model.config), forward_outputs(bf16_model, bf16_model.config))


def test_materialised_model_is_filled_in_place(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)
    target = seeded_model(fp32_model.config, seed=9)
    params_before = {name: p for name, p in target.named_parameters()}
    load_hf_state_dict_into(target, tmp_path)
    assert_bit_equal(target.state_dict(), fp32_model.state_dict())
    # same Parameter objects (an optimizer built before loading still points at them)
    assert all(p is params_before[name] for name, p in target.named_parameters())


def test_materialise_refuses_module_with_loaded_state(fp32_model: LuminaModel, tmp_path: Path) -> None:
    save_pretrained(fp32_model, tmp_path)
    with torch.device("meta"):
        model = LuminaModel(fp32_model.config)
    load_hf_state_dict_into(model, tmp_path)
    norm = model.model.norm
    norm.register_buffer("scratch", torch.empty(3, device="meta"), persistent=False)
    with pytest.raises(RuntimeError, match=r"model\.norm\.scratch"):
        materialise_leftovers(model)


def test_loaded_tensors_do_not_alias_the_files(fp32_model: LuminaModel, tmp_path: Path) -> None:
    """Overwriting the checkpoint files in place after loading must not change the model (safetensors hands
    out tensors backed by a private memory map of the file; the loader copies them)."""
    save_pretrained(fp32_model, tmp_path, layout="fused")
    model = load_pretrained(tmp_path)
    for path in tmp_path.glob("*.safetensors"):
        size = path.stat().st_size
        with path.open("r+b") as handle:
            handle.seek(size // 2)
            handle.write(b"\x00" * (size - size // 2))
    assert_bit_equal(model.state_dict(), fp32_model.state_dict())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["split", "fused"])
def test_load_onto_cuda(bf16_model: LuminaModel, tmp_path: Path, layout: str) -> None:
    save_pretrained(bf16_model, tmp_path, layout=layout, max_shard_size="500KB")
    model = load_pretrained(tmp_path, device="cuda")
    assert all(t.device.type == "cuda" for t in list(model.parameters()) + list(model.buffers()))
    assert_bit_equal(model.state_dict(), bf16_model.state_dict())
