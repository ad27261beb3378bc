"""`lumina-train adapter=lora` with the real Lightning Trainer on the built-in world, from a tiny official
split-layout checkpoint: only the adapter trains (every base tensor bit-identical afterwards, the expert
bias included), the held-out loss falls, and the end-of-run export (merged model + PEFT adapter) gives the
trained logits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lumina.adapters import LoRAGroupedExperts, load_peft_adapter, lora_modules
from lumina.checkpoint import load_pretrained, save_pretrained
from lumina.model import LuminaConfig, LuminaModel
from lumina.training.run import run

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from model_helpers import MIXED_TYPES, make_batch  # noqa: E402
from test_lora import analytic_adapter_bytes  # noqa: E402
from train_helpers import compose_train, quiet, small_data  # noqa: E402

STEPS = 30


def logits(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    model.eval()
    with torch.no_grad():
        out = model(make_batch(MIXED_TYPES * 4, seed=5))
        return out.heads.text_logits(out.text_states), out.heads.image_logits(out.image_states)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A tiny official-layout base (seed 0, fresh init) and a 30-step LoRA rank-4 run from it."""
    root = tmp_path_factory.mktemp("lora_run")
    torch.manual_seed(0)
    base = LuminaModel(LuminaConfig.tiny())
    save_pretrained(base, root / "base", layout="split")
    cfg = compose_train([
        "adapter=lora", "adapter.rank=4", "adapter.alpha=8", f"model.init_from={root / 'base'}",
        f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}", "trainer.limit_val_batches=1.0",
        "optim.lr=3e-3", "optim.warmup_steps=2", "logger=none", "callbacks.checkpoint=null",
        "callbacks.conditioning=null", "callbacks.expert_usage=null", "ckpt_path=null",
        *small_data(num_samples=48), "data.sources.0.options.val_samples=16", *quiet(root / "out")])
    outputs = run(cfg)
    return base.state_dict(), outputs


def test_only_the_adapter_trains_and_every_base_tensor_stays_bit_identical(lora_run):
    base_state, outputs = lora_run
    model = outputs.module.model
    assert outputs.steps == STEPS
    assert any(isinstance(m, LoRAGroupedExperts) for m in model.modules())
    trained = model.state_dict()
    assert [k for k in trained if ".lora_" not in k] == list(base_state)
    changed = [k for k in base_state if not torch.equal(trained[k], base_state[k])]
    assert changed == []
    optimizer = outputs.trainer.optimizers[0]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    lora = {id(p) for n, p in model.named_parameters() if ".lora_" in n}
    assert in_optimizer == lora
    moved_b = [n for n, p in model.named_parameters() if ".lora_B" in n and p.detach().abs().max() > 0]
    assert ".lora_B.gate_proj" in " ".join(moved_b) and "attention.dense.lora_B" in " ".join(moved_b)


def held_out_loss(outputs) -> float:
    """val/loss of the module as it is now, over the run's held-out split (Lightning's validate)."""
    return outputs.trainer.validate(outputs.module, datamodule=outputs.trainer.datamodule,
                                    verbose=False)[0]["val/loss"]


def test_the_held_out_loss_falls(lora_run):
    _, outputs = lora_run
    trained = held_out_loss(outputs)
    saved = {n: p.detach().clone() for n, p in outputs.module.model.named_parameters() if ".lora_B" in n}
    with torch.no_grad():
        for name, param in outputs.module.model.named_parameters():
            if name in saved:
                param.zero_()  # B = 0: exactly the base model (test_lora.py)
    try:
        base = held_out_loss(outputs)
    finally:
        with torch.no_grad():
            for name, param in outputs.module.model.named_parameters():
                if name in saved:
                    param.copy_(saved[name])
    print(f"held-out loss: base {base:.4f} -> LoRA {trained:.4f}")
    assert trained < base - 0.2


def test_the_export_is_the_merged_model_and_the_peft_adapter(lora_run, tmp_path):
    _, outputs = lora_run
    text, image = logits(outputs.module.model)
    export = outputs.output_dir / "hf"
    merged = load_pretrained(export)  # the official split layout loader of the export tests
    merged_text, merged_image = logits(merged)
    torch.testing.assert_close(merged_text, text, rtol=0, atol=1e-5)
    torch.testing.assert_close(merged_image, image, rtol=0, atol=1e-5)
    with safe_open(str(export / "adapter" / "adapter_model.safetensors"), "pt") as f:
        nbytes = sum(f.get_tensor(k).nbytes for k in f.keys())
    assert nbytes == analytic_adapter_bytes(LuminaConfig.tiny(), 4, 4)  # rank 4, fp32
    base = load_pretrained(outputs.output_dir.parent / "base")
    load_peft_adapter(base, export / "adapter")
    assert lora_modules(base)
    adapted_text, adapted_image = logits(base)
    assert torch.equal(adapted_text, text) and torch.equal(adapted_image, image)


def test_config_errors_name_the_field():
    from lumina.training import build

    cfg = compose_train(["adapter=lora", "objective.balance.bias_update=true"])
    with pytest.raises(ValueError, match=r"adapter.name='lora' freezes the base.*bias_update=false"):
        build.module(cfg)
    with pytest.raises(ValueError, match=r"adapter.name='lorra': no adapter of that name; choose one of lora, "):
        build.module(compose_train(["adapter.name=lorra"]))
    with pytest.raises(ValueError, match=r"adapter.rank=0"):
        build.module(compose_train(["adapter=lora", "adapter.rank=0"]))
    with pytest.raises(ValueError, match=r"adapter: .*unexpected keyword argument 'rnk'"):
        build.module(compose_train(["adapter=lora", "+adapter.rnk=4"]))


def test_a_resume_under_another_adapter_is_refused_naming_both():
    from lumina.training import build

    module = build.module(compose_train(["adapter=lora", "adapter.rank=4"]))
    with pytest.raises(ValueError, match=r"adapter=\{'name': 'lora'.*trained with adapter=\{'name': 'none'"):
        module.on_load_checkpoint({"hyper_parameters": {"adapter": {"name": "none"}}})
    with pytest.raises(ValueError, match=r"trained with adapter=\{'name': 'none'\}"):
        module.on_load_checkpoint({"hyper_parameters": {}})  # a checkpoint from before adapters: none


SAVED = ["lm_head", "model.word_embeddings"]  # trained whole beside the adapter (PEFT's modules_to_save)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """The same 30-step LoRA run with adapter.modules_to_save=[lm_head, model.word_embeddings]."""
    root = tmp_path_factory.mktemp("saved_run")
    torch.manual_seed(0)
    base = LuminaModel(LuminaConfig.tiny())
    save_pretrained(base, root / "base", layout="split")
    cfg = compose_train([
        "adapter=lora", "adapter.rank=4", "adapter.alpha=8", f"adapter.modules_to_save=[{','.join(SAVED)}]",
        f"model.init_from={root / 'base'}", f"trainer.max_steps={STEPS}", "trainer.limit_val_batches=0",
        "optim.lr=3e-3", "optim.warmup_steps=2", "logger=none", "callbacks.checkpoint=null",
        "callbacks.conditioning=null", "callbacks.expert_usage=null", "ckpt_path=null",
        *small_data(num_samples=48), *quiet(root / "out")])
    return base.state_dict(), run(cfg)


def test_modules_to_save_train_exactly_those_modules_and_travel_with_the_peft_adapter(saved_run):
    base_state, outputs = saved_run
    model = outputs.module.model
    saved = [f"{name}.weight" for name in SAVED]
    trained = model.state_dict()
    changed = [k for k in base_state if not torch.equal(trained[k], base_state[k])]
    assert sorted(changed) == sorted(saved)  # the rest of the base bit for bit, expert bias included
    optimizer = outputs.trainer.optimizers[0]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for n, p in model.named_parameters() if ".lora_" in n or n in saved}

    export = outputs.output_dir / "hf"
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["model.word_embeddings", "lm_head"]
    with safe_open(str(export / "adapter" / "adapter_model.safetensors"), "pt") as f:
        whole = {k: f.get_tensor(k) for k in f.keys() if ".lora_" not in k}
    assert sorted(whole) == sorted(f"base_model.model.{k}" for k in saved)
    for key in saved:
        assert torch.equal(whole[f"base_model.model.{key}"], trained[key])
    text, image = logits(model)
    merged_text, merged_image = logits(load_pretrained(export))
    torch.testing.assert_close(merged_text, text, rtol=0, atol=1e-5)
    torch.testing.assert_close(merged_image, image, rtol=0, atol=1e-5)
    adapted = load_pretrained(outputs.output_dir.parent / "base")
    load_peft_adapter(adapted, export / "adapter")
    adapted_text, adapted_image = logits(adapted)
    assert torch.equal(adapted_text, text) and torch.equal(adapted_image, image)
