"""Strict mode, fallbacks, and the flex / flash_varlen backends (flex forward on CPU: one compile)."""

from __future__ import annotations

import logging

import pytest
import torch
from attn_helpers import forbid_host_reads, random_pack
from test_backends import HEAD_DIM, HEADS, KV_HEADS, TOLERANCE, qkv, run

from lumina.attention import attend, build_spec
from lumina.attention.backends.segmented import Segmented

CUDA = torch.cuda.is_available()


@pytest.mark.skipif(CUDA, reason="CPU-only behaviour")
def test_flex_with_grad_on_cpu_strict_raises_and_nonstrict_falls_back(attend_calls):
    batch = random_pack(0, [16, 24], tail=4)
    tensors = qkv(batch.seq_len, torch.float32)
    with pytest.raises(RuntimeError, match="'flex' cannot serve.*no backward on CPU"):
        attend(*tensors, build_spec(batch, backend="flex", strict=True))
    q, k, v = tensors
    with pytest.raises(RuntimeError, match="no backward on CPU"):  # a gradient wanted for v alone
        attend(q.detach(), k.detach(), v, build_spec(batch, backend="flex", strict=True))
    attend_calls.clear()
    out = attend(*tensors, build_spec(batch, backend="flex"))
    assert dict(attend_calls) == {"fallback:flex->segmented": 1, "segmented": 1}
    expected = attend(*tensors, build_spec(batch, backend="segmented"))
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_strict_from_environment(monkeypatch):
    batch = random_pack(0, [16, 24])
    monkeypatch.setenv("LUMINA_ATTN_STRICT", "1")
    spec = build_spec(batch, backend="flash_varlen")
    assert spec.strict
    with pytest.raises(RuntimeError, match="'flash_varlen' cannot serve"):
        attend(*qkv(batch.seq_len, torch.float32), spec)
    monkeypatch.setenv("LUMINA_ATTN_STRICT", "0")
    assert not build_spec(batch, backend="flash_varlen").strict


def test_flash_varlen_unavailable_reasons(attend_calls):
    tensors = qkv(40, torch.float32)
    attend_calls.clear()
    attend(*tensors, build_spec(random_pack(0, [16, 24]), backend="flash_varlen"))
    assert dict(attend_calls) == {"fallback:flash_varlen->segmented": 1, "segmented": 1}
    with pytest.raises(RuntimeError, match="flash-attn is not installed|runs on cuda tensors, got device cpu|fp16/bf16"):
        attend(*tensors, build_spec(random_pack(0, [16, 24]), backend="flash_varlen", strict=True))


@pytest.mark.skipif(CUDA, reason="CPU-only behaviour")
def test_a_backend_refuses_devices_its_class_does_not_name(monkeypatch):
    from lumina.attention.backends import flash_varlen

    monkeypatch.setattr(flash_varlen, "flash_attn_varlen_func", object())  # as if flash-attn imported
    batch = random_pack(0, [16, 24], invalid_frac=0.0)
    batch.block_ids.fill_(-1)
    batch.is_clean.fill_(True)
    batch.turn_ids.fill_(0)  # plain segments: only the device is wrong
    tensors = [t.bfloat16() for t in qkv(40, torch.float32)]
    with pytest.raises(RuntimeError, match="'flash_varlen' cannot serve .*: runs on cuda tensors, got device cpu"):
        attend(*tensors, build_spec(batch, backend="flash_varlen", strict=True))


@pytest.mark.slow
def test_flex_forward_matches_dense_with_one_compile(attend_calls):
    """One fixed S (two packs, different segment layouts) -> exactly one compiled graph."""
    from torch._dynamo.utils import counters

    from lumina.attention.backends import flex

    device = "cuda" if CUDA else "cpu"
    graphs_before = counters["stats"]["unique_graphs"]
    for seed, lengths, tail in [(0, [100, 37, 211, 100], 64), (1, [300, 150], 62)]:
        batch = random_pack(seed, lengths, tail=tail).to(device)
        assert batch.seq_len == 512
        q, k, v = (t.detach().to(device) for t in qkv(batch.seq_len, torch.float32, seed=seed))
        attend_calls.clear()
        with torch.no_grad():
            out = attend(q, k, v, build_spec(batch, backend="flex", strict=True))
            expected = attend(q, k, v, build_spec(batch, backend="sdpa_dense"))
        assert dict(attend_calls) == {"flex": 1, "sdpa_dense": 1}
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, expected, **TOLERANCE[torch.float32])
    assert counters["stats"]["unique_graphs"] - graphs_before == 1
    assert flex.compiled_flex.cache_info().currsize == 1


def test_flex_block_table_skips_cross_segment_blocks():
    from lumina.attention.backends.flex import block_table

    batch = random_pack(0, [256, 128, 100], tail=28, invalid_frac=0.0)
    batch.block_ids.fill_(-1)
    batch.is_clean.fill_(True)
    batch.turn_ids.fill_(0)
    any_allowed, all_allowed = block_table(build_spec(batch))
    # blocks: 0-1 segment 0, 2 segment 1, 3 = segment 2 (100 tokens) + tail; clean same-turn = all allowed
    assert any_allowed.tolist() == [[True, True, False, False], [True, True, False, False],
                                    [False, False, True, False], [False, False, False, True]]
    assert all_allowed.tolist() == [[True, True, False, False], [True, True, False, False],
                                    [False, False, True, False], [False, False, False, False]]


def test_flex_block_mask_build_does_no_host_reads(monkeypatch):
    """The BlockMask the first flex layer builds (then cached on the spec) reads no tensor values on the host."""
    from lumina.attention.backends.flex import build_block_mask

    spec = build_spec(random_pack(9, [24, 24, 40, 16], tail=8), backend="flex")

    with forbid_host_reads(monkeypatch, "while building the flex BlockMask"):
        block_mask = build_block_mask(spec)
    assert block_mask.kv_num_blocks.shape == (1, 1, 1)  # S = 112: one 128-block
    assert int(block_mask.full_kv_num_blocks.sum()) == 0  # 4 segments share the block: not fully allowed


def assert_cuda_backend_matches_dense(backend: str, batch, dtype: torch.dtype, seed: int, attend_calls) -> None:
    """Outputs and q/k/v gradients of `backend` on CUDA equal sdpa_dense's, each backend serving its own call."""
    batch = batch.to("cuda")
    tensors = [t.detach().cuda().requires_grad_() for t in qkv(batch.seq_len, dtype, seed=seed)]
    upstream = torch.randn(1, HEADS, batch.seq_len, HEAD_DIM, device="cuda")
    attend_calls.clear()
    dense_out, dense_grads = run("sdpa_dense", batch, tensors, upstream)
    out, grads = run(backend, batch, tensors, upstream)
    assert dict(attend_calls) == {"sdpa_dense": 1, backend: 1}
    for t in [out, *grads]:
        assert torch.isfinite(t).all()
    torch.testing.assert_close(out, dense_out, **TOLERANCE[dtype])
    for g, ref in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(g, ref, **TOLERANCE[dtype])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_backward_matches_dense_on_cuda(dtype, attend_calls):
    assert_cuda_backend_matches_dense("flex", random_pack(2, [100, 37, 211, 100], tail=64), dtype, seed=3,
                                      attend_calls=attend_calls)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_flash_varlen_matches_dense_on_plain_segments(attend_calls):
    pytest.importorskip("flash_attn")
    batch = random_pack(4, [100, 37, 211, 100], tail=64, invalid_frac=0.0)
    batch.block_ids.fill_(-1)
    batch.is_clean.fill_(True)
    batch.turn_ids.fill_(0)
    assert_cuda_backend_matches_dense("flash_varlen", batch, torch.bfloat16, seed=5, attend_calls=attend_calls)
    assert KV_HEADS < HEADS  # the GQA path ran


class NeverServes(Segmented):
    """A backend of the user's own (named by dotted path), which never serves a call."""

    name = "never_serves"

    @staticmethod
    def unavailable(q, k, v, spec):
        return "this test's backend serves nothing"


def test_a_fallback_is_logged_once_and_every_call_reaches_the_hook(attend_calls, caplog):
    batch = random_pack(0, [16, 24], tail=4)
    tensors = qkv(batch.seq_len, torch.float32)
    spec = build_spec(batch, backend=f"{__name__}.NeverServes")
    with caplog.at_level(logging.WARNING, logger="lumina"):
        outs = [attend(*tensors, spec) for _ in range(3)]
    assert dict(attend_calls) == {f"fallback:{__name__}.NeverServes->segmented": 3, "segmented": 3}
    warnings = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert warnings == [f"attention backend '{__name__}.NeverServes' cannot serve this call (this test's backend "
                        "serves nothing); falling back to 'segmented' (logged once)"]
    torch.testing.assert_close(outs[0], attend(*tensors, build_spec(batch, backend="segmented")), atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="NeverServes' cannot serve this call .strict mode.: this test's"):
        attend(*tensors, build_spec(batch, backend=f"{__name__}.NeverServes", strict=True))
