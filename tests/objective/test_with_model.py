"""The objective on the real tiny LuminaModel, one process."""

from __future__ import annotations

import pytest
import torch
from objective_dist_worker import Segment, build_model, make_pack

from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig, find_expert_biases


@pytest.fixture(scope="module")
def model():
    return build_model()


@pytest.mark.parametrize("segment,missing", [
    (Segment(prompt=3, text=5, text_sup=4), "image"),
    (Segment(prompt=3, text=0, text_sup=0, image=5, image_sup=5), "text"),
    (Segment(prompt=3, text=0, text_sup=0, image=4, image_sup=0), "both"),
])
def test_every_conditional_module_gets_a_gradient_when_a_modality_is_missing(model, segment, missing) -> None:
    model.zero_grad(set_to_none=True)
    pack = make_pack([segment], seed=7, pad=2)
    output = model(pack)
    result = LuminaObjective()(output, pack)
    result.loss.backward()
    for name, module in model.conditional_modules().items():
        for p_name, param in module.named_parameters():
            assert param.grad is not None, f"{name}.{p_name} got no gradient"
    if missing in ("image", "both"):
        assert result.num_image_local.item() == 0 and result.image_loss.item() == 0.0
        assert all(head.weight.grad.abs().sum().item() == 0.0 for head in model.lm_img_head)
    if missing in ("text", "both"):
        assert result.num_text_local.item() == 0 and result.text_loss.item() == 0.0
        assert model.lm_head.weight.grad.abs().sum().item() == 0.0
    assert torch.isfinite(result.loss)


def test_targets_are_each_rows_own_label_and_counts_follow_the_pack(model) -> None:
    pack = make_pack([Segment(prompt=2, text=6, text_sup=4, image=3, image_sup=2)], seed=8, pad=1)
    with torch.no_grad():
        output = model(pack)
    result = LuminaObjective()(output, pack)
    # rows: 0-1 prompt, 2-7 text (2-5 supervised), 8-10 image (8-9 supervised), 11 padding
    assert result.num_text_local.item() == 4 and result.num_image_local.item() == 2
    assert result.text_targets.tolist() == pack.labels[0, 2:6, 0].tolist()
    assert result.image_targets.tolist() == pack.labels[0, 8:10].tolist()
    assert result.expert_load.shape == (model.config.num_moe_layers, model.config.num_experts)
    # 11 valid tokens, top-k of each counted once per MoE layer
    assert result.expert_load.sum(dim=1).tolist() == [11.0 * model.config.num_experts_per_tok] * 2


def test_bias_update_reaches_the_models_routers() -> None:
    model = build_model()
    objective = LuminaObjective(ObjectiveConfig())
    pack = make_pack([Segment(prompt=3, text=8, text_sup=6)], seed=9)
    with torch.no_grad():
        objective(model(pack), pack)
    before = [b.clone() for b in find_expert_biases(model)]
    assert len(before) == model.config.num_moe_layers
    objective.on_optimizer_step(model)
    after = find_expert_biases(model)
    assert all(a is moe.gate.expert_bias for a, moe in zip(after, model.moe_layers(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(abs((a - b).sum().item()) < 1e-6 for a, b in zip(after, before, strict=True))


def test_group_setter_reaches_the_bias_counts() -> None:
    objective = LuminaObjective()
    sentinel = object()
    objective.group = sentinel
    assert objective.group is sentinel and objective.bias_updater.group is sentinel


def test_zero_weights_keep_every_conditional_module_in_the_graph(model) -> None:
    model.zero_grad(set_to_none=True)
    pack = make_pack([Segment(prompt=2, text=4, text_sup=3, image=3, image_sup=3)], seed=10)
    result = LuminaObjective(ObjectiveConfig(text_weight=0.0, image_weight=0.0))(model(pack), pack)
    assert result.loss.item() == 0.0 and result.text_loss.item() > 0 and result.image_loss.item() > 0
    result.loss.backward()
    for name, module in model.conditional_modules().items():
        assert all(p.grad is not None for p in module.parameters()), name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    pack = make_pack([Segment(prompt=3, text=6, text_sup=4, image=4, image_sup=3)], seed=11, pad=2)
    cfg = ObjectiveConfig(text_weighting="inverse_t", balance=BalanceConfig(aux_coef=0.01))
    results = {}
    for device in ("cpu", "cuda"):
        model = build_model().to(device)
        batch = pack.to(device)
        objective = LuminaObjective(cfg)
        objective.configure_routers(model)
        result = objective(model(batch), batch)
        result.loss.backward()
        update = objective.on_optimizer_step(model)
        results[device] = (result, update, model.lm_head.weight.grad)
    (cpu, cpu_update, cpu_grad), (gpu, gpu_update, gpu_grad) = results["cpu"], results["cuda"]
    assert gpu.loss.device.type == "cuda"
    torch.testing.assert_close(gpu.loss.cpu(), cpu.loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu.image_loss_per_codebook.cpu(), cpu.image_loss_per_codebook, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu.expert_load.sum(dim=1).cpu(), cpu.expert_load.sum(dim=1))
    torch.testing.assert_close(gpu_grad.cpu(), cpu_grad, rtol=1e-3, atol=1e-6)
    assert gpu_update is not None and cpu_update is not None
