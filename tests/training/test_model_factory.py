"""`build_model`: fresh, meta-device then materialised, or streamed from an HF checkpoint directory."""

import torch

from lumina.checkpoint import save_pretrained
from lumina.checkpoint.model_factory import build_model
from lumina.model import LuminaConfig, LuminaModel


def test_meta_init_materialises_every_tensor():
    model = build_model(LuminaConfig.tiny(), meta_init=True)
    tensors = dict(model.state_dict())
    tensors.update(dict(model.named_buffers()))  # non-persistent ones (rotary inv_freq) too
    assert all(not t.is_meta for t in tensors.values())
    mask = tensors.pop("multi_codebook_head.channel_mask").float()  # 0 on/below the diagonal, -inf above
    assert torch.equal(mask, torch.full((4, 4), float("-inf")).triu(1))
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())
    weight = model.model.word_embeddings.weight
    assert 0.01 < weight.std().item() < 0.04  # N(0, 0.02) init, not zeros / garbage


def test_init_from_loads_the_checkpoint_weights(tmp_path):
    torch.manual_seed(0)
    source = LuminaModel(LuminaConfig.tiny())
    with torch.no_grad():
        for buffer in source.model.layers[1].mlp.modules():
            if hasattr(buffer, "expert_bias"):
                buffer.expert_bias.copy_(torch.arange(buffer.expert_bias.numel(), dtype=torch.float32))
    save_pretrained(source, tmp_path)
    loaded = build_model(LuminaConfig.from_hf(tmp_path), init_from=tmp_path)
    expected = source.state_dict()
    got = loaded.state_dict()
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key].to(got[key].dtype), got[key]), key
