"""The parallel per-codebook image head (`image_head: parallel`): it trains on the built-in world, round-trips
through DCP and lumina's fused HF layout, is refused by the official split layout, has no channel-autoregressive
dependency, and the t2i sampler draws every codebook of a cell from it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from train_helpers import compose_train, quiet, small_data

from lumina.checkpoint import load_pretrained, save_pretrained
from lumina.contract.batch import PackedBatch
from lumina.contract.schema import Text
from lumina.contract.special_tokens import SpecialTokens
from lumina.distributed.dcp_io import load_dcp_weights
from lumina.generation import ImageSamplingConfig, Prompt, generate_images
from lumina.model import LuminaConfig, LuminaModel
from lumina.model.image_heads.parallel import ParallelCodebookHead
from lumina.training.run import run

C, K = 4, 64  # codebooks and codebook size of the tiny config


def tiny(seed: int = 0, **overrides) -> LuminaModel:
    torch.manual_seed(seed)
    return LuminaModel(LuminaConfig.tiny(image_head="parallel", **overrides)).eval()


def image_batch(codes_seed: int) -> PackedBatch:
    """Text prompt rows then type-4 image answer rows labelled with codes drawn from `codes_seed`."""
    types = torch.tensor([1, 1, 1, 4, 4, 4, 4, 4, 3])
    seq = len(types)
    g = torch.Generator().manual_seed(codes_seed)
    labels = torch.full((seq, C), -100)
    labels[types == 4] = torch.randint(0, K, (5, C), generator=g)
    labels[types == 3, 0] = 7
    input_ids = torch.where((types == 4)[:, None], torch.full((seq, C), K - 1), torch.arange(20, 20 + seq)[:, None])
    return PackedBatch(input_ids=input_ids, type_ids=types, turn_ids=torch.zeros(seq, dtype=torch.long),
                       block_ids=torch.full((seq,), -1), position_ids=torch.arange(seq),
                       is_clean=torch.ones(seq, dtype=torch.bool), token_valid=torch.ones(seq, dtype=torch.bool),
                       cu_seqlens=torch.tensor([0, seq], dtype=torch.int32), labels=labels)


def test_the_config_builds_the_parallel_head_under_its_own_keys():
    model = tiny()
    assert isinstance(model.image_head, ParallelCodebookHead)
    keys = set(model.state_dict())
    assert not any(k.startswith("multi_codebook_head.") for k in keys)
    assert {"parallel_codebook_head.proj.weight", "lm_img_head.3.weight"} <= keys


def test_training_states_do_not_depend_on_the_teacher_forcing_codes():
    """Every codebook from h alone: other target codes leave the parallel head's states unchanged, while the
    channel-autoregressive head's later positions change with them."""
    parallel = tiny()
    a, b = parallel(image_batch(1)).image_states, parallel(image_batch(2)).image_states
    assert a.shape == (5, C, 64) and torch.equal(a, b)
    torch.manual_seed(0)
    channel = LuminaModel(LuminaConfig.tiny()).eval()
    a, b = channel(image_batch(1)).image_states, channel(image_batch(2)).image_states
    assert torch.equal(a[:, 0], b[:, 0]) and not torch.allclose(a[:, 1:], b[:, 1:])


def test_dcp_and_fused_hf_round_trips_keep_the_logits_and_the_split_layout_refuses_it(tmp_path):
    model = tiny(seed=1)
    batch = image_batch(3)
    expected = model(batch)
    expected_logits = expected.heads.image_logits(expected.image_states)

    dcp.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
             checkpoint_id=str(tmp_path / "dcp"))
    from_dcp = load_dcp_weights(tiny(seed=2), tmp_path / "dcp")
    out = from_dcp(batch)
    assert torch.equal(out.heads.image_logits(out.image_states), expected_logits)

    save_pretrained(model, tmp_path / "hf", layout="fused")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["image_head"] == "parallel"
    loaded = load_pretrained(tmp_path / "hf").eval()
    assert isinstance(loaded.image_head, ParallelCodebookHead)
    out = loaded(batch)
    assert torch.equal(out.heads.image_logits(out.image_states), expected_logits)
    assert torch.equal(out.heads.text_logits(out.text_states), expected.heads.text_logits(expected.text_states))

    with pytest.raises(ValueError, match=r"image_head='parallel'"):
        save_pretrained(model, tmp_path / "split", layout="split")


def test_sampling_draws_every_codebook_from_one_pass_equal_to_a_per_codebook_argmax():
    model = tiny(seed=4)
    h = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))

    def argmax(logits, c):
        return logits.argmax(-1), logits.softmax(-1).amax(-1)

    codes, probs = model.sample_image_codes(h, argmax)
    with torch.no_grad():
        states = model.image_head.run(h)
        manual = torch.stack([model.lm_img_head[c](states[:, c]) for c in range(C)], dim=1)
    assert codes.shape == (6, C) and torch.equal(codes, manual.argmax(-1))
    assert torch.allclose(probs, manual.softmax(-1).amax(-1))


def _special_tokens() -> SpecialTokens:
    return SpecialTokens(pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7, bo3d=8, eo3d=9,
                         system_open=10, system_close=11, user_open=12, user_close=13, uncondition=14,
                         img_context=500, video_context=501, mesh3d_context=502, newline=503,
                         text_vocab_size=512, codebook_size=K, num_codebooks=C)


def test_t2i_sampler_decodes_the_codes_the_parallel_head_favours_and_is_seeded():
    model = tiny(seed=5)
    favourite = [5, 17, 63, 0]
    v = torch.zeros(64)
    v[0] = 8.0
    with torch.no_grad():  # every state = v (LayerNorm weight 0, bias v); lm_img_head[c] scores favourite[c]
        model.image_head.norm.weight.zero_()
        model.image_head.norm.bias.copy_(v)
        for c, head in enumerate(model.lm_img_head):
            head.weight.zero_()
            head.weight[favourite[c]] = v
    prompts = [Prompt([Text([50])], key=0, grid=(2, 3))]
    [answer] = generate_images(model, prompts, _special_tokens(), ImageSamplingConfig(steps=3, temperature=1.0))
    assert torch.equal(answer.codes, torch.tensor(favourite).expand(6, -1))

    fresh = tiny(seed=6)
    config = ImageSamplingConfig(steps=3, temperature=1.0, cfg_scale=0.0)
    first, again = (generate_images(fresh, prompts, _special_tokens(), config)[0] for _ in range(2))
    other = generate_images(fresh, prompts, _special_tokens(), dataclasses.replace(config, seed=1))[0]
    assert first.codes.shape == (6, C) and int(first.codes.max()) < K and int(first.codes.min()) >= 0
    assert torch.equal(first.codes, again.codes) and not torch.equal(first.codes, other.codes)


def test_the_tiny_model_with_the_parallel_head_learns_the_builtin_world(tmp_path):
    """A real Lightning run (`image_head=parallel`): the image loss falls; the end-of-run export is lumina's
    fused layout, which the HF reader loads back into a parallel head."""
    cfg = compose_train(["image_head=parallel", "trainer.max_steps=40", "trainer.limit_val_batches=0",
                         "logger=csv", *quiet(tmp_path), *small_data(num_samples=32)])
    outputs = run(cfg)
    losses = outputs.losses
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["image_head"] == "parallel" and config["model_type"] == "llada2_moe_veomni"
    assert isinstance(load_pretrained(tmp_path / "hf").image_head, ParallelCodebookHead)
