"""lumina's PEFT-format adapter against `peft` itself (the `peft` extra, pinned in pyproject; skipped where it
is not installed): peft loads lumina's export onto a module tree with the official split-layout names and
merges to lumina's merged export, and an adapter peft writes for those names imports into lumina; both with
and without modules trained whole (`modules_to_save`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from lumina.adapters import LoRA, load_peft_adapter, merge_adapter, save_peft_adapter
from lumina.checkpoint import save_pretrained
from lumina.model import LuminaConfig, LuminaModel

peft = pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from model_helpers import MIXED_TYPES, make_batch  # noqa: E402


def split_weights(model: nn.Module, directory: Path) -> dict[str, torch.Tensor]:
    """`model` written in the official split layout and read back as one state dict."""
    save_pretrained(model, directory, layout="split")
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def split_tree(weights: dict[str, torch.Tensor]) -> nn.Module:
    """A bare module tree with the split layout's names: a bias-free nn.Linear per 2-D `<module>.weight`."""
    root = nn.Module()
    for key, tensor in weights.items():
        if not key.endswith(".weight") or tensor.dim() != 2:
            continue
        *path, leaf = key[:-len(".weight")].split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        linear = nn.Linear(tensor.shape[1], tensor.shape[0], bias=False)
        linear.weight.data.copy_(tensor)
        node.add_module(leaf, linear)
    return root


def linear_weights(weights: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in weights.items() if k.endswith(".weight") and v.dim() == 2]


def base_model() -> LuminaModel:
    torch.manual_seed(0)
    return LuminaModel(LuminaConfig.tiny()).eval()


SAVED = ["lm_head", "model.word_embeddings"]  # modules_to_save: trained whole, written whole


@pytest.mark.parametrize("modules_to_save", [[], SAVED])
def test_peft_loads_the_export_and_merges_to_lumina_merged_weights(tmp_path, modules_to_save):
    base_split = split_weights(base_model(), tmp_path / "base")
    model = base_model()
    adapter = LoRA(rank=4, alpha=8, modules_to_save=modules_to_save)
    adapter.apply(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B" in name or name.removesuffix(".weight") in modules_to_save:
                param.copy_(torch.randn(param.shape, generator=g) * 0.05)
    save_peft_adapter(model, tmp_path / "adapter", modules_to_save=adapter.saved_modules(model))
    lumina_merged = split_weights(merge_adapter(model), tmp_path / "merged")

    loaded = peft.PeftModel.from_pretrained(split_tree(base_split), str(tmp_path / "adapter"))
    peft_merged = loaded.merge_and_unload()
    for key in linear_weights(lumina_merged):
        torch.testing.assert_close(peft_merged.get_parameter(key), lumina_merged[key], rtol=0, atol=1e-6)
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in lumina_merged
    assert not torch.equal(lumina_merged["model.layers.2.mlp.experts.7.down_proj.weight"],
                           base_split["model.layers.2.mlp.experts.7.down_proj.weight"])
    for name in modules_to_save:  # peft took the trained module, not the base's
        assert not torch.equal(lumina_merged[f"{name}.weight"], base_split[f"{name}.weight"])


@pytest.mark.parametrize("modules_to_save", [None, ["lm_head"]])
def test_an_adapter_peft_writes_imports_into_lumina(tmp_path, modules_to_save):
    base_split = split_weights(base_model(), tmp_path / "base")
    targets = sorted({k[:-len(".weight")] for k in linear_weights(base_split)
                      if (".attention." in k or ".mlp." in k) and ".mlp.gate." not in k})
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, modules_to_save=modules_to_save)
    written = peft.get_peft_model(split_tree(base_split), config)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in written.named_parameters():
            if "lora_B" in name or ".modules_to_save." in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.05)
    written.save_pretrained(str(tmp_path / "peft_adapter"))
    peft_merged = written.merge_and_unload()

    model = base_model()
    load_peft_adapter(model, tmp_path / "peft_adapter")
    merged = merge_adapter(model)
    lumina_merged = split_weights(merged, tmp_path / "merged")
    for key in linear_weights(lumina_merged):
        torch.testing.assert_close(lumina_merged[key], peft_merged.get_parameter(key), rtol=0, atol=1e-6)
    with torch.no_grad():
        batch = make_batch(MIXED_TYPES * 4, seed=3)
        adapted, plain, base = model(batch), merged(batch), base_model()(batch)
        text = [out.heads.text_logits(out.text_states) for out in (adapted, plain, base)]
    torch.testing.assert_close(text[0], text[1], rtol=0, atol=1e-5)
    assert not torch.allclose(text[0], text[2], atol=1e-3)
    for name in modules_to_save or []:
        assert not torch.equal(model.get_parameter(f"{name}.weight"), base_split[f"{name}.weight"])
