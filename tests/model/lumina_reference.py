"""A naive, loop-based re-statement of the official forward, written from the contract's text
(/work/shared/reference/internlumina-u2-contract.md sections 2, 3, 5.2) and reading only a state dict.
Used as the independent reference of the model tests; it computes in float64 by default."""

from __future__ import annotations

import math

import torch

from lumina.model.config import LuminaConfig

Sd = dict[str, torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32 (or wider), cast back to x's dtype, then multiply by the weight."""
    wide = x.double() if x.dtype == torch.float64 else x.float()
    normed = wide / torch.sqrt((wide * wide).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float = 1e-6) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    return y if weight is None else y * weight + bias


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def rope(x: torch.Tensor, position: float, rotary_dim: int, theta: float) -> torch.Tensor:
    """x [hd] at one position: dim i (i < rotary_dim/2) pairs with i + rotary_dim/2; dims >= rotary_dim kept."""
    out = x.clone()
    half = rotary_dim // 2
    for i in range(half):
        angle = position * theta ** (-2 * i / rotary_dim)
        a, b = x[i], x[i + half]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


def attention(x: torch.Tensor, sd: Sd, prefix: str, cfg: LuminaConfig, positions: list[int]) -> torch.Tensor:
    """Bidirectional attention over all S rows of x [S, H]."""
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qkv = x @ sd[prefix + "query_key_value.weight"].T
    group = nh // nkv
    seq = x.shape[0]

    def head(rows_from: int, s: int, norm: str | None) -> torch.Tensor:
        vec = qkv[s, rows_from:rows_from + hd]
        if norm is None:
            return vec
        vec = rms_norm(vec, sd[prefix + norm], cfg.rms_norm_eps)
        return rope(vec, positions[s], cfg.rotary_dims, cfg.rope_theta)

    outs = []
    for h in range(nh):
        j = h // group  # kv head j serves query heads j*g .. j*g+g-1
        q = torch.stack([head(h * hd, s, "query_layernorm.weight") for s in range(seq)])
        k = torch.stack([head(nh * hd + j * hd, s, "key_layernorm.weight") for s in range(seq)])
        v = torch.stack([head((nh + nkv) * hd + j * hd, s, None) for s in range(seq)])
        weights = torch.softmax(q @ k.T / math.sqrt(hd), dim=-1)
        outs.append(weights @ v)
    return torch.cat(outs, dim=-1) @ sd[prefix + "dense.weight"].T


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def route(x: torch.Tensor, gate_weight: torch.Tensor, expert_bias: torch.Tensor,
          cfg: LuminaConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loop. x [T, H] -> (logits fp32 [T, E], ids [T, k] by descending biased score, weights [T, k])."""
    logits = x.float() @ gate_weight.float().T
    scores = torch.sigmoid(logits)
    per_group = cfg.num_experts // cfg.n_group
    all_ids, all_weights = [], []
    for t in range(x.shape[0]):
        biased = [float(scores[t, e].detach()) + float(expert_bias[e]) for e in range(cfg.num_experts)]
        group_score = []
        for g in range(cfg.n_group):
            members = sorted(biased[g * per_group:(g + 1) * per_group], reverse=True)
            group_score.append(members[0] + members[1])
        kept = sorted(range(cfg.n_group), key=lambda g: -group_score[g])[:cfg.topk_group]
        candidates = [e for e in range(cfg.num_experts) if e // per_group in kept]
        chosen = sorted(candidates, key=lambda e: -biased[e])[:cfg.num_experts_per_tok]
        s = torch.stack([scores[t, e] for e in chosen])
        all_ids.append(chosen)
        if len(chosen) > 1:  # the official gate normalises only for k > 1 (its code; the contract omits it)
            s = s / (s.sum() + 1e-20)
        all_weights.append(s * cfg.routed_scaling_factor)
    return logits, torch.tensor(all_ids), torch.stack(all_weights)


def moe(x: torch.Tensor, sd: Sd, prefix: str, cfg: LuminaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (y [T, H], ids [T, k]): sum_k w_k Expert_k(x) + unweighted shared expert."""
    _, ids, weights = route(x, sd[prefix + "gate.weight"], sd[prefix + "gate.expert_bias"], cfg)
    rows = []
    for t in range(x.shape[0]):
        y = torch.zeros_like(x[t])
        for slot in range(ids.shape[1]):
            e = int(ids[t, slot])
            y = y + weights[t, slot].to(x.dtype) * swiglu(
                x[t], sd[prefix + "experts.gate_proj"][e], sd[prefix + "experts.up_proj"][e],
                sd[prefix + "experts.down_proj"][e])
        if prefix + "shared_experts.gate_proj.weight" in sd:
            y = y + swiglu(x[t], *(sd[prefix + f"shared_experts.{p}_proj.weight"] for p in ("gate", "up", "down")))
        rows.append(y)
    return torch.stack(rows), ids


def embed(input_ids: torch.Tensor, types: torch.Tensor, sd: Sd, cfg: LuminaConfig) -> torch.Tensor:
    """input_ids [S, C], types [S] -> [S, H]."""
    rows = []
    for s in range(input_ids.shape[0]):
        if int(types[s]) in (2, 4):
            parts = [sd[f"model.img_embeddings.{c}.weight"][int(input_ids[s, c])] for c in range(cfg.num_codebooks)]
            rows.append(torch.cat(parts) @ sd["model.img_embeddings_proj.weight"].T)
        else:
            rows.append(sd["model.word_embeddings.weight"][int(input_ids[s, 0])])
    return torch.stack(rows)


def channel_head(h: torch.Tensor, codes: torch.Tensor, sd: Sd, cfg: LuminaConfig) -> torch.Tensor:
    """h [N, H], codes [N, C] -> image logits [N, C, K] by teacher forcing."""
    p = "multi_codebook_head."
    n_cb, heads = cfg.num_codebooks, cfg.channel_heads
    dim = h.shape[-1]
    hd = dim // heads
    cond = h @ sd[p + "condition_proj.weight"].T + sd[p + "condition_proj.bias"]
    embs = [sd[f"model.img_embeddings.{c}.weight"][codes[:, c]] for c in range(n_cb - 1)]
    x = torch.stack([cond, *embs], dim=1) + sd[p + "channel_embed"]
    ada = silu(cond[:, None, :] + sd[p + "timesteps_embeddings"])
    for b in range(cfg.channel_depth):
        q_ = f"{p}channel_blocks.{b}."
        mod = ada @ sd[q_ + "adaLN_modulation.1.weight"].T + sd[q_ + "adaLN_modulation.1.bias"]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.split(dim, dim=-1)
        xn = layer_norm(x, sd[q_ + "norm1.weight"], sd[q_ + "norm1.bias"]) * (1 + scale_a) + shift_a
        qkv = xn @ sd[q_ + "attn.qkv.weight"].T + sd[q_ + "attn.qkv.bias"]  # [N, C, 3D]: q | k | v, head-major
        attn_out = torch.zeros_like(x)
        for hh in range(heads):
            q = layer_norm(qkv[..., hh * hd:(hh + 1) * hd], sd[q_ + "attn.q_norm.weight"], sd[q_ + "attn.q_norm.bias"])
            k = layer_norm(qkv[..., dim + hh * hd:dim + (hh + 1) * hd], sd[q_ + "attn.k_norm.weight"],
                           sd[q_ + "attn.k_norm.bias"])
            v = qkv[..., 2 * dim + hh * hd:2 * dim + (hh + 1) * hd]
            scores = q @ k.transpose(1, 2) / math.sqrt(hd)
            future = torch.ones(n_cb, n_cb, dtype=torch.bool).triu(1)  # position i sees positions <= i
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            attn_out[..., hh * hd:(hh + 1) * hd] = weights @ v
        x = x + gate_a * (attn_out @ sd[q_ + "attn.proj.weight"].T + sd[q_ + "attn.proj.bias"])
        xn = layer_norm(x, sd[q_ + "norm2.weight"], sd[q_ + "norm2.bias"]) * (1 + scale_m) + shift_m
        mlp = gelu_exact(xn @ sd[q_ + "mlp.fc1.weight"].T + sd[q_ + "mlp.fc1.bias"])
        x = x + gate_m * (mlp @ sd[q_ + "mlp.fc2.weight"].T + sd[q_ + "mlp.fc2.bias"])
    x = layer_norm(x, sd[p + "channel_norm.weight"], sd[p + "channel_norm.bias"])
    mod = ada @ sd[p + "channel_final.adaLN_modulation.1.weight"].T + sd[p + "channel_final.adaLN_modulation.1.bias"]
    scale, shift = mod.split(dim, dim=-1)
    x = layer_norm(x, None, None) * (1 + scale) + shift
    return torch.stack([x[:, j] @ sd[f"lm_img_head.{j}.weight"].T for j in range(n_cb)], dim=1)


def forward(sd: Sd, cfg: LuminaConfig, input_ids: torch.Tensor, types: torch.Tensor, positions: list[int],
            labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """One fully bidirectional sequence. input_ids/labels [S, C], types [S] -> hidden, text/image logits, ids."""
    h = embed(input_ids, types, sd, cfg)
    ids_per_layer = []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        h = h + attention(rms_norm(h, sd[pre + "input_layernorm.weight"], cfg.rms_norm_eps), sd,
                          pre + "attention.", cfg, positions)
        normed = rms_norm(h, sd[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        if i < cfg.first_k_dense_replace:
            h = h + swiglu(normed, *(sd[pre + f"mlp.{p}_proj.weight"] for p in ("gate", "up", "down")))
        else:
            y, ids = moe(normed, sd, pre + "mlp.", cfg)
            h = h + y
            ids_per_layer.append(ids)
    h = rms_norm(h, sd["model.norm.weight"], cfg.rms_norm_eps)
    text = [s for s in range(h.shape[0]) if int(types[s]) == 3 and int(labels[s, 0]) != -100]
    image = [s for s in range(h.shape[0]) if int(types[s]) == 4 and bool((labels[s] != -100).any())]
    return {
        "hidden": h,
        "text_logits": h[text] @ sd["lm_head.weight"].T,
        "image_logits": channel_head(h[image], labels[image], sd, cfg),
        "topk_ids": ids_per_layer,
    }
