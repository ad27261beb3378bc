"""The whole tiny model against the naive loop re-statement of the contract (`lumina_reference`)."""

from __future__ import annotations

import torch
from lumina_reference import forward as reference_forward
from model_helpers import make_batch

from lumina.model import LuminaConfig, LuminaModel

TYPES = [1, 1, 2, 2, 1, 3, 3, 3, 1, 4, 4, 4, 4, 3]


def _perturbed(model: LuminaModel) -> None:
    """Give every norm and bias non-trivial values so no quirk can hide behind ones/zeros."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) if "weight" in name
                        else 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for moe in model.moe_layers():
            moe.gate.expert_bias.copy_(0.2 * torch.randn(moe.gate.expert_bias.shape, generator=g))


def test_tiny_model_matches_naive_reference() -> None:
    cfg = LuminaConfig.tiny(torch_dtype="float64")
    torch.manual_seed(0)
    model = LuminaModel(cfg).double()
    _perturbed(model)
    batch = make_batch(TYPES, seed=3)
    batch.position_ids = batch.position_ids * 7 + 3  # positions far apart so the rotation matters
    out = model(batch)

    # tolerance: the contract keeps cos/sin and the router weights in fp32 even in a float64 model
    sd = {k: (v.double() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    ref = reference_forward(sd, cfg, batch.input_ids[0], batch.type_ids[0], batch.position_ids[0].tolist(),
                            batch.labels[0])
    torch.testing.assert_close(out.hidden[0], ref["hidden"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.heads.text_logits(out.text_states), ref["text_logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.heads.image_logits(out.image_states), ref["image_logits"], rtol=1e-5, atol=1e-5)
    assert out.text_rows.tolist() == [5, 6, 7, 13]
    assert out.image_rows.tolist() == [9, 10, 11, 12]
    assert len(out.router_topk_ids) == len(ref["topk_ids"]) == cfg.num_moe_layers
    for got, want in zip(out.router_topk_ids, ref["topk_ids"], strict=True):
        assert torch.equal(got[0], want)
