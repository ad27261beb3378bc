"""CUDA-only: the bf16 grouped-GEMM path on the device (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import make_batch

from lumina.model import LuminaConfig, LuminaModel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bf16_grouped_and_loop_backends_agree_on_cuda() -> None:
    outs = []
    for backend in ("grouped_mm", "loop"):
        torch.manual_seed(0)
        model = LuminaModel(LuminaConfig.tiny(moe_backend=backend)).cuda().to(torch.bfloat16)
        out = model(make_batch([1, 2, 2, 3, 3, 4, 4, 1]).to("cuda"))
        out.heads.text_logits(out.text_states).float().sum().backward()
        outs.append((out.hidden.float(), model.model.layers[1].mlp.experts.gate_proj.grad.float()))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
