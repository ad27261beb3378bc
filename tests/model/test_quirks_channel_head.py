"""The multi-codebook channel head against contract sections 2 and 5.2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lumina_reference import channel_head as reference_channel_head
from lumina_reference import layer_norm

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


def forced_logits(model: LuminaModel, h: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Teacher forcing through the model's parts: h [N, H], codes int64 [N, C] -> logits [N, C, K]."""
    states = model.multi_codebook_head(h, model.model.embed_codes(codes)[:, :-1])
    return model.heads().image_logits(states)


def test_channel_head_teacher_forcing_matches_the_contract() -> None:
    """cond = condition_proj(h); input [cond, emb_0..emb_{C-2}] + channel_embed; adaLN cond + timesteps_j;
    block chunks (shift, scale, gate) x2, final (scale, shift); channel_norm then norm_final; causal mask;
    per-head LayerNorm q/k; exact GELU; position j -> lm_img_head[j]; embeddings from img_embeddings."""
    model = _model()
    cfg = model.config
    h = torch.randn(5, cfg.hidden_size, dtype=torch.float64)
    codes = torch.randint(0, cfg.codebook_size, (5, cfg.num_codebooks))
    got = forced_logits(model, h, codes)
    sd = {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    want = reference_channel_head(h, codes, sd, cfg)
    assert got.shape == (5, cfg.num_codebooks, cfg.codebook_size)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def test_codebook_c_depends_only_on_codes_before_c() -> None:
    model = _model()
    cfg = model.config
    h = torch.randn(3, cfg.hidden_size, dtype=torch.float64)
    codes = torch.randint(0, cfg.codebook_size, (3, cfg.num_codebooks))
    base = forced_logits(model, h, codes)
    for c in range(cfg.num_codebooks):
        changed = codes.clone()
        changed[:, c] = (changed[:, c] + 1) % cfg.codebook_size
        diff = (forced_logits(model, h, changed) - base).abs().amax(dim=(0, 2))
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
    forced = F.softmax(forced_logits(model, h, codes), dim=-1)
    assert torch.equal(forced.argmax(-1), codes)
    torch.testing.assert_close(forced.gather(2, codes[..., None])[..., 0], probs)


# ---- one focused test per channel-head quirk (contract section 2 / 5.2), each computed by hand ----

def _set_modulation(linear: torch.nn.Linear, chunks: list[torch.Tensor]) -> None:
    """adaLN Linear with zero weight: its output is the bias, i.e. the given chunks whatever the condition."""
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.copy_(torch.cat(chunks))


def test_block_modulation_chunks_are_shift_scale_gate_for_attention_then_mlp() -> None:
    model = _model()
    block = model.multi_codebook_head.channel_blocks[0]
    dim = model.config.hidden_size
    g = torch.Generator().manual_seed(3)
    shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = (torch.randn(dim, generator=g, dtype=torch.float64)
                                                          for _ in range(6))
    _set_modulation(block.adaLN_modulation[1], [shift_a, scale_a, gate_a, shift_m, scale_m, gate_m])
    x = torch.randn(2, 4, dim, dtype=torch.float64)
    cond = torch.randn(2, 4, dim, dtype=torch.float64)
    mask = torch.zeros(4, 4, dtype=torch.float64)
    normed = layer_norm(x, block.norm1.weight, block.norm1.bias)
    x1 = x + gate_a * block.attn(normed * (1 + scale_a) + shift_a, mask)
    normed = layer_norm(x1, block.norm2.weight, block.norm2.bias)
    want = x1 + gate_m * block.mlp(normed * (1 + scale_m) + shift_m)
    torch.testing.assert_close(block(x, cond, mask), want, rtol=1e-10, atol=1e-10)


def test_final_layer_chunks_are_scale_then_shift() -> None:
    model = _model()
    final = model.multi_codebook_head.channel_final
    dim = model.config.hidden_size
    scale, shift = torch.randn(dim, dtype=torch.float64), torch.randn(dim, dtype=torch.float64)
    _set_modulation(final.adaLN_modulation[1], [scale, shift])
    x = torch.randn(3, 4, dim, dtype=torch.float64)
    got = final(x, torch.randn(3, 4, dim, dtype=torch.float64))
    torch.testing.assert_close(got, layer_norm(x, None, None) * (1 + scale) + shift, rtol=1e-10, atol=1e-10)


def test_head_input_adaln_condition_and_the_two_final_layer_norms() -> None:
    """Block input [cond, emb_0..emb_{C-2}] + channel_embed with cond = condition_proj(h); adaLN condition at
    position j = cond + timesteps_embeddings[j]; after the blocks channel_norm (affine) and then the final
    layer's own parameter-free LayerNorm."""
    model = _model()
    head, cfg = model.multi_codebook_head, model.config
    zeros = torch.zeros(2 * cfg.hidden_size, dtype=torch.float64)
    _set_modulation(head.channel_final.adaLN_modulation[1], [zeros])
    seen: dict[str, torch.Tensor] = {}
    head.channel_blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0], ada=args[1]))
    head.channel_blocks[-1].register_forward_hook(lambda m, args, out: seen.update(last=out))
    h = torch.randn(5, cfg.hidden_size, dtype=torch.float64)
    codes = torch.randint(0, cfg.codebook_size, (5, cfg.num_codebooks))
    states = head(h, model.model.embed_codes(codes)[:, :-1])

    cond = h @ head.condition_proj.weight.T + head.condition_proj.bias
    tables = model.model.img_embeddings
    inputs = [cond] + [tables[c].weight[codes[:, c]] for c in range(cfg.num_codebooks - 1)]
    torch.testing.assert_close(seen["x"], torch.stack(inputs, dim=1) + head.channel_embed, rtol=0, atol=1e-12)
    for j in range(cfg.num_codebooks):
        want = cond + head.timesteps_embeddings[0, j]
        torch.testing.assert_close(seen["ada"][:, j], want, rtol=0, atol=1e-12)
    # final modulation is zero here (scale = shift = 0): states = LayerNorm(channel_norm(last block output))
    twice = layer_norm(layer_norm(seen["last"], head.channel_norm.weight, head.channel_norm.bias), None, None)
    torch.testing.assert_close(states, twice, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(states, layer_norm(seen["last"], None, None), atol=1e-3)  # channel_norm is observable
