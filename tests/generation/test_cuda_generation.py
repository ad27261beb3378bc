"""The samplers on a CUDA device (skipped without one): seeded, and the fixed-head checks hold there too."""

from __future__ import annotations

import pytest
import torch
from test_image_sampler import _fix_channel_head
from test_text_sampler import _favour_token

from lumina.contract.schema import Text
from lumina.generation import ImageSamplingConfig, Prompt, TextSamplingConfig, generate_images, generate_text

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_text_and_images_on_cuda(tiny_model, tokens):
    model = tiny_model.cuda()
    prompts = [Prompt([Text([20 + i])], key=i, grid=(2, 3)) for i in range(3)]
    text_cfg = TextSamplingConfig(gen_length=8, block_length=4, steps=2, temperature=1.0)
    image_cfg = ImageSamplingConfig(steps=3, cfg_scale=2.0)
    first = generate_text(model, prompts, tokens, text_cfg), generate_images(model, prompts, tokens, image_cfg)
    again = generate_text(model, prompts, tokens, text_cfg), generate_images(model, prompts, tokens, image_cfg)
    assert [a.raw for a in first[0]] == [a.raw for a in again[0]]
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(first[1], again[1], strict=True))
    _favour_token(model, 77)
    _fix_channel_head(model, [1, 2, 3, 4])
    assert all(a.raw == [77] * 8 for a in generate_text(model, prompts, tokens, text_cfg))
    for answer in generate_images(model, prompts, tokens, image_cfg):
        assert torch.equal(answer.codes, torch.tensor([1, 2, 3, 4]).expand(6, -1))


@pytest.mark.parametrize("backend", ["segmented", "sdpa_dense", "flex"])
def test_the_cache_equals_the_full_forward_on_cuda(backend, tokens):
    """The fp32 attention backends serve the cache's query rows against [cached, query] key rows on CUDA, with
    the full forward's answers (flash_varlen, bf16 only: tests/attention test_query_subset_on_cuda)."""
    from test_kv_cache import image_prompts, text_prompts

    from lumina.model import LuminaModel
    from lumina.model.config import LuminaConfig

    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny(attn_backend=backend)).eval().cuda()
    text, image = {}, {}
    for cache in (False, True):
        text[cache] = [a.raw for a in generate_text(model, text_prompts(), tokens, TextSamplingConfig(
            gen_length=16, block_length=8, steps=4, temperature=0.0, cache=cache))]
        image[cache] = [a.codes for a in generate_images(model, image_prompts(), tokens, ImageSamplingConfig(
            steps=4, cfg_scale=2.0, temperature=0.0, cache=cache))]
    assert text[True] == text[False]
    assert all(torch.equal(a, b) for a, b in zip(image[True], image[False], strict=True))
