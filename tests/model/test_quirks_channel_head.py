"""The multi-codebook channel head against contract sections 2 and 5.2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lumina_reference import channel_head as reference_channel_head

from lumina.model import LuminaConfig, LuminaModel


def _model(seed: int = 0) -> LuminaModel:
    torch.manual_seed(seed)
    model = LuminaModel(LuminaConfig.tiny()).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial LayerNorm affines and biases everywhere in the head
        for name, p in model.multi_codebook_head.named_parameters():
            if p.dim() == 1:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.mul_(8)  # large adaLN modulations so every chunk order matters
    return model


def test_channel_head_teacher_forcing_matches_the_contract() -> None:
    """cond = condition_proj(h); input [cond, emb_0..emb_{C-2}] + channel_embed; adaLN cond + timesteps_j;
    block chunks (shift, scale, gate) x2, final (scale, shift); channel_norm then norm_final; causal mask;
    per-head LayerNorm q/k; exact GELU; position j -> lm_img_head[j]; embeddings from img_embeddings."""
    model = _model()
    cfg = model.config
    h = torch.randn(5, cfg.hidden_size, dtype=torch.float64)
    codes = torch.randint(0, cfg.codebook_size, (5, cfg.num_codebooks))
    got = model.image_head(h, codes)
    sd = {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    want = reference_channel_head(h, codes, sd, cfg)
    assert got.shape == (5, cfg.num_codebooks, cfg.codebook_size)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def test_codebook_c_depends_only_on_codes_before_c() -> None:
    model = _model()
    cfg = model.config
    h = torch.randn(3, cfg.hidden_size, dtype=torch.float64)
    codes = torch.randint(0, cfg.codebook_size, (3, cfg.num_codebooks))
    base = model.image_head(h, codes)
    for c in range(cfg.num_codebooks):
        changed = codes.clone()
        changed[:, c] = (changed[:, c] + 1) % cfg.codebook_size
        diff = (model.image_head(h, changed) - base).abs().amax(dim=(0, 2))
        assert (diff[: c + 1] == 0).all(), f"codebook {c} leaked into positions <= {c}"
        if c + 1 < cfg.num_codebooks:
            assert (diff[c + 1:] > 0).all()


def test_channel_mask_is_a_persistent_bf16_causal_buffer() -> None:
    model = LuminaModel(LuminaConfig.tiny()).float()
    mask = model.state_dict()["multi_codebook_head.channel_mask"]
    assert mask.dtype == torch.bfloat16
    n = model.config.num_codebooks
    for i in range(n):
        for j in range(n):
            assert mask[i, j].item() == (0.0 if j <= i else float("-inf"))


def test_sampling_entry_reproduces_teacher_forcing_on_its_own_codes() -> None:
    model = _model()
    cfg = model.config
    h = torch.randn(4, cfg.hidden_size, dtype=torch.float64)
    seen = []

    def greedy(logits: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(c)
        probs = F.softmax(logits, dim=-1)
        tokens = probs.argmax(-1)
        return tokens, probs.gather(1, tokens[:, None])[:, 0]

    codes, probs = model.sample_image_codes(h, greedy)
    assert seen == list(range(cfg.num_codebooks))
    assert codes.shape == probs.shape == (4, cfg.num_codebooks)
    forced = F.softmax(model.image_head(h, codes), dim=-1)
    assert torch.equal(forced.argmax(-1), codes)
    torch.testing.assert_close(forced.gather(2, codes[..., None])[..., 0], probs)
