"""Parameter groups, the warmup + cosine schedule and the optimizer config checks."""

import math

import pytest
import torch

from lumina.model import LuminaConfig, LuminaModel
from lumina.training.errors import ConfigError
from lumina.training.optim import OptimConfig, build_optimizer, build_scheduler, split_decay, warmup_cosine


def expected_no_decay(name: str) -> bool:
    """Written from the official key list: embedding tables, every norm weight, every bias, and the channel
    head's bare embedding parameters get no weight decay."""
    leaf = name.rsplit(".", 1)[-1]
    module = name.rsplit(".", 1)[0] if "." in name else ""
    return (
        "word_embeddings" in module
        or (".img_embeddings." in f".{module}." and "proj" not in module)
        or leaf == "bias"
        or module.endswith(("layernorm", "norm", "norm1", "norm2", "q_norm", "k_norm", "channel_norm"))
        or leaf in ("channel_embed", "timesteps_embeddings")
    )


def test_split_decay_matches_the_official_key_classes():
    model = LuminaModel(LuminaConfig.tiny())
    decay, no_decay = split_decay(model)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(decay + no_decay) == sorted(names)
    assert not set(decay) & set(no_decay)
    assert {n for n in names if expected_no_decay(n)} == set(no_decay)
    # spot checks of both classes
    assert "model.img_embeddings_proj.weight" in decay
    assert "model.layers.1.mlp.experts.gate_proj" in decay
    assert "model.layers.1.mlp.gate.weight" in decay
    assert "model.img_embeddings.3.weight" in no_decay
    assert "model.layers.0.attention.query_layernorm.weight" in no_decay


def test_optimizer_groups_carry_their_weight_decay():
    model = LuminaModel(LuminaConfig.tiny())
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.25, lr=1e-3))
    decay_group, no_decay_group = optimizer.param_groups
    assert decay_group["weight_decay"] == 0.25 and no_decay_group["weight_decay"] == 0.0
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in model.parameters()}


@pytest.mark.parametrize(("step", "expected"), [
    (0, 0.2), (3, 0.8), (4, 1.0), (8, 0.1 + 0.9 * 0.5), (12, 0.1), (30, 0.1),
    (6, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25))),
])
def test_warmup_cosine_hand_values(step, expected):
    # warmup 4: (step + 1) / 5; cosine from step 4 to 12 down to 0.1
    assert warmup_cosine(step, warmup_steps=4, decay_steps=12, min_lr_ratio=0.1) == pytest.approx(expected)


def test_scheduler_drives_the_learning_rate():
    param = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([param], lr=2.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=2.0, warmup_steps=1, min_lr_ratio=0.0), max_steps=3)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # step 0: warmup 1/2; step 1: cosine start 1.0; step 2: half way 0.5; step 3: end 0.0 (times lr 2)
    assert seen == pytest.approx([1.0, 2.0, 1.0, 0.0])


def test_scheduler_needs_a_horizon():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ConfigError, match="max_steps"):
        build_scheduler(optimizer, OptimConfig(), max_steps=-1)


@pytest.mark.parametrize(("field", "value"), [
    ("lr", 0.0), ("betas", [0.9]), ("weight_decay", -1.0), ("warmup_steps", -2), ("min_lr_ratio", 1.5),
])
def test_bad_optim_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=f"optim.{field}="):
        OptimConfig(**{field: value})


def test_adamw_is_fused_where_torch_has_the_kernel_unless_configured_off():
    model = LuminaModel(LuminaConfig.tiny())
    assert build_optimizer(model, OptimConfig()).defaults["fused"] is True  # plain CPU tensors
    assert not build_optimizer(model, OptimConfig(fused=False)).defaults["fused"]
    # one step of each from the same gradients: the same update up to fp32 rounding
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    updates = []
    for fused in (True, False):
        optimizer = build_optimizer(model, OptimConfig(fused=fused))
        optimizer.step()
        updates.append({n: p.detach() - before[n] for n, p in model.named_parameters()})
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(before[n])
    for name, update in updates[0].items():
        assert update.abs().max() > 0, name
        torch.testing.assert_close(update, updates[1][name], rtol=1e-4, atol=1e-7, msg=name)
