"""Every backend against `sdpa_dense` (itself checked against a float64 softmax reference): outputs and
gradients, fp32 and bf16, finiteness at every row, and call counters proving which path ran."""

from __future__ import annotations

import pytest
import torch
from attn_helpers import forbid_host_reads, random_pack

from lumina.attention import allowed_mask, attend, build_spec

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
PACKS = {
    "mixed": dict(lengths=[37, 64, 9, 64, 30], tail=12),  # two equal lengths batch into one call
    "equal": dict(lengths=[32, 32, 32, 32], tail=0, invalid_frac=0.0),
    "simple": dict(lengths=[50, 21, 50], tail=5, full_rules=False),
}


def qkv(seq_len: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, HEADS, seq_len, HEAD_DIM), (1, KV_HEADS, seq_len, HEAD_DIM), (1, KV_HEADS, seq_len, HEAD_DIM)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def run(backend: str, batch, tensors: list[torch.Tensor], upstream: torch.Tensor):
    spec = build_spec(batch, backend=backend, strict=True)
    out = attend(*tensors, spec)
    grads = torch.autograd.grad((out.float() * upstream).sum(), tensors)
    return out.detach().float(), [g.float() for g in grads]


def reference(batch, tensors: list[torch.Tensor]) -> torch.Tensor:
    """float64 softmax with the official additive mask (finfo(float32).min where blocked)."""
    q, k, v = (t.double() for t in tensors)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    allowed = allowed_mask(batch.token_valid, batch.cu_seqlens, batch.type_ids, batch.turn_ids,
                           batch.is_clean, batch.block_ids)[:, None]
    bias = torch.where(allowed, 0.0, float(torch.finfo(torch.float32).min)).double()
    return ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + bias).softmax(-1) @ v


def test_dense_matches_float64_reference_everywhere():
    batch = random_pack(1, **PACKS["mixed"])
    tensors = qkv(batch.seq_len, torch.float32)
    upstream = torch.randn(1, HEADS, batch.seq_len, HEAD_DIM, generator=torch.Generator().manual_seed(9))
    out, grads = run("sdpa_dense", batch, tensors, upstream)
    ref = reference(batch, tensors)
    ref_grads = torch.autograd.grad((ref * upstream.double()).sum(), tensors)
    assert (~batch.token_valid).sum() > 12  # tail rows and invalid rows inside segments are exercised
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r.float(), atol=1e-4, rtol=1e-4)


TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pack_name", sorted(PACKS))
def test_segmented_matches_dense(pack_name, dtype, attend_calls):
    batch = random_pack(2, **PACKS[pack_name])
    tensors = qkv(batch.seq_len, dtype, seed=4)
    upstream = torch.randn(1, HEADS, batch.seq_len, HEAD_DIM, generator=torch.Generator().manual_seed(5))
    attend_calls.clear()
    dense_out, dense_grads = run("sdpa_dense", batch, tensors, upstream)
    out, grads = run("segmented", batch, tensors, upstream)
    assert dict(attend_calls) == {"sdpa_dense": 1, "segmented": 1}
    for t in [dense_out, out, *dense_grads, *grads]:
        assert torch.isfinite(t).all()
    torch.testing.assert_close(out, dense_out, **TOLERANCE[dtype])
    for g, ref in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(g, ref, **TOLERANCE[dtype])


def test_layers_reuse_the_cached_masks():
    batch = random_pack(3, **PACKS["mixed"])
    for backend in ("sdpa_dense", "segmented"):
        spec = build_spec(batch, backend=backend)
        tensors = qkv(batch.seq_len, torch.float32)
        attend(*tensors, spec)
        cached = {key: id(value) for key, value in spec.cache.items()}
        attend(*tensors, spec)
        assert cached and {key: id(value) for key, value in spec.cache.items()} == cached


def test_attend_shape_errors():
    batch = random_pack(0, [8, 8])
    spec = build_spec(batch)
    q, k, v = qkv(16, torch.float32)
    with pytest.raises(ValueError, match="q has 15 rows and k 15; the spec was built for Lq=16 query rows"):
        attend(q[:, :, :15], k[:, :, :15], v[:, :, :15], spec)
    with pytest.raises(ValueError, match="q has 16 rows and k 15; .* Lk=16 key rows"):
        attend(q, k[:, :, :15], v[:, :, :15], spec)
    with pytest.raises(ValueError, match="query heads 4 are not a multiple of kv heads 3"):
        attend(q, k[:, :1].repeat(1, 3, 1, 1), v[:, :1].repeat(1, 3, 1, 1), spec)
    with pytest.raises(ValueError, match="4-D"):
        attend(q[0], k[0], v[0], spec)


def test_segmented_token_major_layout_and_batch_of_two():
    """B = 2 query batches over one pack (e.g. guidance branches), q/k/v in token-major memory."""
    batch = random_pack(6, [24, 24, 24, 10, 30], tail=8)
    g = torch.Generator().manual_seed(7)
    seq_len = batch.seq_len
    tensors = [torch.randn(2, seq_len, heads, HEAD_DIM, generator=g).transpose(1, 2).requires_grad_()
               for heads in (HEADS, KV_HEADS, KV_HEADS)]
    upstream = torch.randn(2, HEADS, seq_len, HEAD_DIM, generator=g)
    dense_out, dense_grads = run("sdpa_dense", batch, tensors, upstream)
    out, grads = run("segmented", batch, tensors, upstream)
    torch.testing.assert_close(out, dense_out, **TOLERANCE[torch.float32])
    for grad, ref in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(grad, ref, **TOLERANCE[torch.float32])
    ref = reference(batch, [t[1:] for t in tensors])  # batch row 1 against the float64 reference
    torch.testing.assert_close(out[1:], ref.float(), atol=1e-5, rtol=1e-5)


def test_chunked_rule_evaluation_matches_allowed_mask(monkeypatch):
    from lumina.attention import spec as spec_module

    batch = random_pack(8, [40, 23, 31], tail=6)
    spec = build_spec(batch)
    whole = slice(0, batch.seq_len)
    expected = allowed_mask(batch.token_valid, batch.cu_seqlens, batch.type_ids, batch.turn_ids,
                            batch.is_clean, batch.block_ids)
    monkeypatch.setattr(spec_module, "ALLOWED_CHUNK", 7 * batch.seq_len)  # 7 rows per chunk
    assert torch.equal(spec.allowed(whole, whole), expected)
    assert torch.equal(spec.allowed(slice(40, 63), slice(40, 63)), expected[:, 40:63, 40:63])


@pytest.mark.parametrize("backend", ["sdpa_dense", "segmented"])
def test_layers_do_no_host_reads(backend, monkeypatch):
    """All host work happens in build_spec: attend (first layer included) never reads a tensor's values."""
    batch = random_pack(9, [24, 24, 40, 16], tail=8)
    spec = build_spec(batch, backend=backend)
    tensors = qkv(batch.seq_len, torch.float32)

    with forbid_host_reads(monkeypatch, "inside attend"):
        for _ in range(2):
            out = attend(*tensors, spec)
    assert torch.isfinite(out).all()
