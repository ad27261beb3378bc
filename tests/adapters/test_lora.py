"""LoRA on the tiny model (`lumina.adapters`): step 0 is the base, the routed experts' grouped path equals a
per-expert loop, merge, and PEFT's on-disk format written and read back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lumina.adapters import (
    LoRA,
    LoRAGroupedExperts,
    LoRALinear,
    load_peft_adapter,
    merge_adapter,
    merged_state_dict,
    save_peft_adapter,
)
from lumina.adapters.grouped_lora import lora_swiglu
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.experts import grouped_mm_supported

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from model_helpers import MIXED_TYPES, make_batch  # noqa: E402

RANK, ALPHA = 4, 8.0


def logits(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(text logits, image logits) of the tiny model on one mixed batch."""
    with torch.no_grad():
        out = model(make_batch(MIXED_TYPES * 4, seed=3))
        return out.heads.text_logits(out.text_states), out.heads.image_logits(out.image_states)


def base_model(seed: int = 0) -> LuminaModel:
    torch.manual_seed(seed)
    return LuminaModel(LuminaConfig.tiny()).eval()


def randomise_b(model: torch.nn.Module, seed: int = 1) -> None:
    """Give every LoRA B a non-zero value (as training would)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.05)


def test_targets_adapt_attention_mlps_shared_and_routed_experts_not_the_router():
    model = base_model()
    names = LoRA(rank=RANK, alpha=ALPHA).apply(model)
    config = LuminaConfig.tiny()
    adapted = {n.split(".lora_")[0] for n in names}
    expected = set()
    for i in range(config.num_hidden_layers):
        expected |= {f"model.layers.{i}.attention.query_key_value", f"model.layers.{i}.attention.dense"}
        mlp = f"model.layers.{i}.mlp."
        if config.is_moe_layer(i):
            shared = {f"{mlp}shared_experts.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
            expected |= {mlp + "experts"} | shared
        else:
            expected |= {mlp + p for p in ("gate_proj", "up_proj", "down_proj")}
    assert adapted == expected
    assert not any(".mlp.gate." in n for n in names)
    experts = model.get_submodule("model.layers.1.mlp.experts")
    assert isinstance(experts, LoRAGroupedExperts)
    assert experts.lora_A["gate_proj"].shape == (config.num_experts, RANK, config.hidden_size)
    assert experts.lora_B["down_proj"].shape == (config.num_experts, config.hidden_size, RANK)


def test_base_state_dict_keys_and_tensors_are_unchanged_by_apply():
    model = base_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    after = model.state_dict()
    base_keys = [k for k in after if ".lora_" not in k]
    assert base_keys == list(before)
    assert all(torch.equal(after[k], before[k]) for k in base_keys)


def test_zero_initialised_b_gives_the_base_logits():
    model = base_model()
    text, image = logits(model)
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    lora_text, lora_image = logits(model)
    assert torch.equal(lora_text, text) and torch.equal(lora_image, image)
    randomise_b(model)  # the same comparison sees a non-zero adapter
    moved, _ = logits(model)
    assert not torch.allclose(moved, text, atol=1e-3)


def test_base_view_computes_the_base_in_eval_mode_and_restores_the_adapter():
    """The post-training reference under LoRA: a trained adapter switched off gives the base's logits bit for
    bit; leaving the view restores the adapter and each module's own train / eval mode."""
    text, image = logits(base_model())
    model = base_model()
    adapter = LoRA(rank=RANK, alpha=ALPHA)
    adapter.apply(model)
    randomise_b(model)
    adapted_text, _ = logits(model)
    model.train()
    model.lm_head.eval()  # a module's own mode survives the view
    with adapter.base_view(model) as view:
        assert view is model and not model.training
        view_text, view_image = logits(model)
    assert torch.equal(view_text, text) and torch.equal(view_image, image)
    assert model.training and not model.lm_head.training
    assert torch.equal(logits(model.eval())[0], adapted_text)
    assert LoRA(rank=RANK, modules_to_save=["lm_head"]).base_view(model) is None  # those base modules train


@pytest.mark.parametrize(("dtype", "backend"), [(torch.float32, "grouped_mm"), (torch.bfloat16, "grouped_mm"),
                                               (torch.float32, "loop")])
def test_grouped_expert_lora_equals_a_per_expert_loop_with_gradients(dtype, backend):
    """`lora_swiglu` (grouped GEMM path, or its matmul-per-expert form) against a plain per-expert
    computation with dense B_e A_e."""
    g = torch.Generator().manual_seed(0)
    experts, hidden, inter, rank, scale = 4, 32, 16, 8, 2.0
    counts = torch.tensor([5, 0, 7, 4])
    rows = torch.randn(int(counts.sum()), hidden, generator=g).to(dtype).requires_grad_()
    base = tuple(torch.randn(s, generator=g).to(dtype) * 0.1 for s in
                 [(experts, inter, hidden), (experts, inter, hidden), (experts, hidden, inter)])
    lora_a = tuple((torch.randn(s, generator=g) * 0.1).to(dtype).requires_grad_() for s in
                   [(experts, rank, hidden), (experts, rank, hidden), (experts, rank, inter)])
    lora_b = tuple((torch.randn(s, generator=g) * 0.1).to(dtype).requires_grad_() for s in
                   [(experts, inter, rank), (experts, inter, rank), (experts, hidden, rank)])
    assert all(grouped_mm_supported(rows, w) for w in (*base, *lora_a, *lora_b))  # the fused path runs
    y = lora_swiglu(rows, base, lora_a, lora_b, scale, counts, backend)
    leaves = (rows, *lora_a, *lora_b)
    grads = torch.autograd.grad(y.float().square().sum(), leaves)

    outs = []
    for e, x in enumerate(rows.float().split(counts.tolist())):
        w = [base[p][e].float() + scale * lora_b[p][e].float() @ lora_a[p][e].float() for p in range(3)]
        outs.append(torch.nn.functional.linear(torch.nn.functional.silu(x @ w[0].T) * (x @ w[1].T), w[2]))
    expected = torch.cat(outs)
    expected_grads = torch.autograd.grad(expected.square().sum(), leaves)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(y.float(), expected, **tol)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.float(), want.float(), **tol)


def test_merge_gives_a_plain_model_with_the_adapted_logits():
    model = base_model()
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    randomise_b(model)
    text, image = logits(model)
    merged = merge_adapter(model)
    assert not any(isinstance(m, LoRALinear | LoRAGroupedExperts) for m in merged.modules())
    assert list(merged.state_dict()) == list(base_model().state_dict())
    merged_text, merged_image = logits(merged)
    torch.testing.assert_close(merged_text, text, rtol=0, atol=1e-5)
    torch.testing.assert_close(merged_image, image, rtol=0, atol=1e-5)
    base_text, _ = logits(base_model())
    assert not torch.allclose(merged_text, base_text, atol=1e-3)  # the merge did add the update
    assert any(isinstance(m, LoRAGroupedExperts) for m in model.modules())  # the adapted model is kept
    exported = merged_state_dict(model)  # what the end-of-run export writes
    plain = merged.state_dict()
    assert list(exported) == list(plain)
    assert all(torch.equal(exported[key], plain[key]) for key in plain)


def analytic_adapter_bytes(config: LuminaConfig, rank: int, bytes_per: int) -> int:
    """r (in + out) per adapted Linear and per expert projection, from the config's dimensions."""
    h, hd = config.hidden_size, config.head_dim
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    attention = rank * (h + (heads + 2 * kv) * hd) + rank * (heads * hd + h)
    total = 0
    for i in range(config.num_hidden_layers):
        total += attention
        if config.is_moe_layer(i):
            total += 3 * rank * (h + config.shared_expert_size)
            total += config.num_experts * 3 * rank * (h + config.moe_intermediate_size)
        else:
            total += 3 * rank * (h + config.intermediate_size)
    return total * bytes_per


def test_peft_export_round_trip_and_size(tmp_path):
    model = base_model()
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    randomise_b(model)
    text, image = logits(model)
    out = save_peft_adapter(model, tmp_path / "adapter")

    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", RANK, ALPHA)
    assert "model.layers.1.mlp.experts.7.down_proj" in config["target_modules"]
    assert "model.layers.0.attention.query_key_value" in config["target_modules"]
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
        nbytes = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in keys)
        expert_a = f.get_tensor("base_model.model.model.layers.2.mlp.experts.5.up_proj.lora_A.weight")
        expert_b = f.get_tensor("base_model.model.model.layers.2.mlp.experts.5.up_proj.lora_B.weight")
    tiny = LuminaConfig.tiny()
    assert nbytes == analytic_adapter_bytes(tiny, RANK, 4)
    assert expert_a.shape == (RANK, tiny.hidden_size) and expert_b.shape == (tiny.moe_intermediate_size, RANK)
    live = model.get_submodule("model.layers.2.mlp.experts")
    assert torch.equal(expert_b, live.lora_B["up_proj"][5].detach())
    assert "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight" in keys

    fresh = base_model()
    load_peft_adapter(fresh, out)
    fresh_text, fresh_image = logits(fresh)
    assert torch.equal(fresh_text, text) and torch.equal(fresh_image, image)
    with pytest.raises(FileExistsError, match="adapter_config.json"):
        save_peft_adapter(model, out)


def test_peft_import_refuses_wrong_shapes_and_missing_experts(tmp_path):
    model = base_model()
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    out = save_peft_adapter(model, tmp_path / "a")
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(out / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight"
    del tensors[key]
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"experts\.3\.gate_proj\.lora_A"):
        load_peft_adapter(base_model(), out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["r"] = RANK * 2
    (out / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has shape"):
        load_peft_adapter(base_model(), out)
    config.update(r=RANK, use_dora=True)
    (out / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_dora=True"):
        load_peft_adapter(base_model(), out)


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="adapter.rank=0"):
        LoRA(rank=0)
    with pytest.raises(ValueError, match=r"dropout is refused on the routed experts .*layers\.1\.mlp"):
        LoRA(rank=RANK, dropout=0.1).apply(base_model())
    with pytest.raises(ValueError, match=r"selects 'model\.layers\.1\.mlp\.gate', a SigmoidRouter"):
        LoRA(rank=RANK, targets=["*.mlp.gate"]).apply(base_model())
    with pytest.raises(ValueError, match=r"'\*\.attention\.qkv' matches no module"):
        LoRA(rank=RANK, targets=["*.attention.qkv"]).apply(base_model())
    LoRA(rank=RANK, dropout=0.1, targets=["*.attention.dense"]).apply(base_model())  # fine on a Linear
    with pytest.raises(ValueError, match=r"selects 'lm_head', a Head with a forward of its own"):
        LoRA(rank=RANK, targets=["lm_head"]).apply(base_model())
    LoRA(rank=RANK, targets=["multi_codebook_head.channel_blocks.*.attn.qkv"]).apply(base_model())  # channel head
    with pytest.raises(ValueError, match=r"adapter.seed=-1"):
        LoRA(rank=RANK, seed=-1)


def test_the_adapter_is_drawn_from_its_seed_the_same_on_meta_and_leaves_the_base_init_alone():
    """Applied on meta and materialised unit by unit (what the sharding strategy does) or applied to a built
    model: the same tensors, base and adapter; the base is what it is without an adapter; another seed draws
    other A's."""
    from lumina.distributed.parallelize import materialise

    eager = base_model(seed=0)
    names = LoRA(rank=RANK, alpha=ALPHA, seed=5).apply(eager)
    torch.manual_seed(0)
    with torch.device("meta"):
        lazy = LuminaModel(LuminaConfig.tiny())
    LoRA(rank=RANK, alpha=ALPHA, seed=5).apply(lazy)
    position = {id(m): n for n, m in enumerate(lazy.modules())}
    units = sorted([*lazy.model.layers, *lazy.conditional_modules().values()], key=lambda m: position[id(m)])
    for unit in units:  # a unit at a time in model order, as `parallelize` does
        materialise(unit, torch.device("cpu"))
    materialise(lazy, torch.device("cpu"))
    want, got = eager.state_dict(), lazy.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    plain = base_model(seed=0).state_dict()
    assert all(torch.equal(want[key], value) for key, value in plain.items())
    other = base_model(seed=0)
    LoRA(rank=RANK, alpha=ALPHA, seed=6).apply(other)
    a_names = [n for n in names if ".lora_A" in n]
    assert not any(torch.equal(other.get_parameter(n), eager.get_parameter(n)) for n in a_names)
    experts_a = eager.get_parameter("model.layers.1.mlp.experts.lora_A.up_proj")
    bound = 1 / LuminaConfig.tiny().hidden_size ** 0.5
    assert experts_a.abs().max() <= bound and experts_a.abs().max() > 0.9 * bound  # Kaiming-uniform, a = sqrt(5)
    assert all(eager.get_parameter(n).abs().max() == 0 for n in names if ".lora_B" in n)


def test_memory_estimate_counts_gradients_and_states_of_the_adapter_only():
    from lumina.training.memory_estimate import Precision, estimate_step_memory

    config = LuminaConfig.tiny()
    full = estimate_step_memory(config, 256)
    lora = estimate_step_memory(config, 256, adapter=LoRA(rank=RANK, alpha=ALPHA))
    adapter_count = analytic_adapter_bytes(config, RANK, 1)
    assert lora.parameter_count == full.parameter_count + adapter_count
    assert lora.trainable_count == adapter_count
    assert lora.gradients == adapter_count * 4 and lora.optimizer_states == 2 * adapter_count * 4
    assert full.trainable_count == full.parameter_count
    # bf16 parameters: a trainable head's fused loss keeps an fp32 weight-gradient accumulator; a frozen head none
    bf16 = Precision(param_bytes=2, activation_bytes=2, gathered_bytes=2)
    full16 = estimate_step_memory(config, 256, precision=bf16)
    lora16 = estimate_step_memory(config, 256, precision=bf16, adapter=LoRA(rank=RANK, alpha=ALPHA))
    heads = (config.vocab_size + config.num_codebooks * config.codebook_size) * config.hidden_size
    assert full16.head_losses - lora16.head_losses == heads * 4
    # modules_to_save: the text head's gradient and AdamW states on top of the adapter's (and its accumulator)
    saved = estimate_step_memory(config, 256, adapter=LoRA(rank=RANK, alpha=ALPHA, modules_to_save=["lm_head"]))
    head = config.vocab_size * config.hidden_size
    assert saved.trainable_count == adapter_count + head
    assert saved.gradients == (adapter_count + head) * 4 and saved.optimizer_states == 2 * (adapter_count + head) * 4


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_activation_checkpointing_gives_the_same_adapter_gradients(policy):
    from lumina.model.activation_checkpointing import apply_checkpointing

    def adapter_grads(checkpointing: str) -> dict[str, torch.Tensor]:
        model = base_model().train()
        names = LoRA(rank=RANK, alpha=ALPHA).apply(model)
        randomise_b(model)
        apply_checkpointing(model, checkpointing)
        for name, param in model.named_parameters():
            param.requires_grad_(name in names)
        out = model(make_batch(MIXED_TYPES * 4, seed=3))
        loss = out.heads.text_logits(out.text_states).square().mean() + \
            out.heads.image_logits(out.image_states).square().mean()
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if n in names}

    plain, checkpointed = adapter_grads("none"), adapter_grads(policy)
    assert plain.keys() == checkpointed.keys() and all(g is not None for g in plain.values())
    assert any(".experts.lora_A" in n and plain[n].abs().max() > 0 for n in plain)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=0, atol=0, msg=name)


def test_reset_parameters_draws_the_base_init_and_a_zero_b():
    model = base_model()
    LoRA(rank=RANK, alpha=ALPHA).apply(model)
    randomise_b(model)
    std = LuminaConfig.tiny().initializer_range
    for name in ("model.layers.1.attention.dense", "model.layers.1.mlp.experts"):
        module = model.get_submodule(name)
        before = module.weight.clone() if isinstance(module, LoRALinear) else module.up_proj.clone()
        module.reset_parameters()
        after = module.weight if isinstance(module, LoRALinear) else module.up_proj
        assert not torch.equal(after, before)
        assert 0.8 * std < after.std().item() < 1.2 * std  # N(0, std), not nn.Linear's Kaiming bound
        assert all(p.abs().max() == 0 for n, p in module.named_parameters() if n.startswith("lora_B"))


def test_modules_to_save_are_refused_by_name_when_they_cannot_be_trained_whole(tmp_path):
    with pytest.raises(ValueError, match=r"adapter.modules_to_save='lm_head': must be a list"):
        LoRA(rank=RANK, modules_to_save="lm_head")
    for globs, pattern in ((["lm_haed"], r"'lm_haed' matches no module"),
                           (["*.attention.dense"], r"selects 'model\.layers\.0\.attention\.dense', and LoRA adapts "
                                                   r"'model\.layers\.0\.attention\.dense'"),
                           (["model.layers.0"], r"selects 'model\.layers\.0', and LoRA adapts "
                                                r"'model\.layers\.0\.attention\.query_key_value'"),
                           (["model"], r"selects 'model', which holds routed experts"),
                           (["model.rotary_emb"], r"selects 'model\.rotary_emb', a .* with no parameters")):
        model = base_model()
        adapter = LoRA(rank=RANK, modules_to_save=globs)
        adapter.apply(model)
        with pytest.raises(ValueError, match=pattern):
            adapter.saved_modules(model)
    model = base_model()
    adapter = LoRA(rank=RANK, targets=["*.attention.dense"], modules_to_save=["lm_*", "*.mlp.gate"])
    added = adapter.apply(model)
    assert adapter.saved_modules(model)[-1] == "lm_img_head" and "model.layers.1.mlp.gate" in adapter.saved_modules(model)
    trainable = adapter.trainable(model, added)
    assert trainable[:len(added)] == added
    assert set(trainable[len(added):]) == {n for n, _ in model.named_parameters()
                                            if n.startswith(("lm_head.", "lm_img_head.")) or ".mlp.gate." in n}

    out = save_peft_adapter(model, tmp_path / "a", modules_to_save=adapter.saved_modules(model))
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(out / "adapter_model.safetensors"))
    config = json.loads((out / "adapter_config.json").read_text())
    saved = config["modules_to_save"]
    assert saved == adapter.saved_modules(model)
    (out / "adapter_config.json").write_text(json.dumps({**config, "modules_to_save": ["lm_haed"]}))
    with pytest.raises(ValueError, match=r"modules_to_save entry 'lm_haed' names no module"):
        load_peft_adapter(base_model(), out)
    (out / "adapter_config.json").write_text(json.dumps(config))
    del tensors["base_model.model.lm_head.weight"]
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"no base_model\.model\.lm_head\.weight \(modules_to_save names 'lm_head'"):
        load_peft_adapter(base_model(), out)
