"""Worker of the 2-process FSDP2 generation test: every rank samples its own prompts from one sharded model."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lumina.contract.schema import Text
from lumina.contract.special_tokens import SpecialTokens
from lumina.generation import ImageSamplingConfig, Prompt, TextSamplingConfig, generate_images, generate_text
from lumina.model import LuminaModel
from lumina.model.config import LuminaConfig

TOKENS = SpecialTokens(pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7, bo3d=8, eo3d=9, system_open=10,
                       system_close=11, user_open=12, user_close=13, uncondition=14, text_vocab_size=512,
                       codebook_size=64, num_codebooks=4)
TEXT = TextSamplingConfig(gen_length=16, block_length=4, steps=2, temperature=1.0, batch_size=1)
IMAGE = ImageSamplingConfig(steps=2, cfg_scale=1.0, batch_size=1)


def eoa_prone_model() -> LuminaModel:
    """The tiny model with EOA made likely (~8% per slot): word embeddings carry +1000 in dim 0, so every final
    hidden state has h_0 ~ 8 and the rest ~0, and lm_head's EOA row reads dim 0. Answers then end after a
    random number of blocks that depends on each prompt's own random stream."""
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig.tiny()).eval()
    with torch.no_grad():
        model.model.word_embeddings.weight[:, 0] += 1000.0
        model.lm_head.weight[TOKENS.eoa, 0] = 3.8 / 8
    return model


def text_prompt(key: int) -> Prompt:
    return Prompt([Text([20 + key, 21])], key=key)


def image_prompt(key: int) -> Prompt:
    return Prompt([Text([30 + key])], key=key, grid=(2, 2))


def run_worker(rank: int, world: int, init_file: str, out_dir: str, text_keys: list[list[int]],
               image_keys: list[list[int]], eval_keys: list[int]) -> None:
    from torch.distributed.fsdp import fully_shard

    from lumina.world.evaluation import _sharded

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name in ("fsdp", "fsdp_ep"):
            model = eoa_prone_model()
            if name == "fsdp":  # fully_shard per decoder layer + root
                for layer in model.model.layers:
                    fully_shard(layer)
                fully_shard(model)
            else:  # lumina's plan: experts split over 2 ep ranks (all-to-all dispatch), heads as their own units
                from lumina.distributed import ParallelConfig, build_meshes, parallelize
                from lumina.distributed.parallel_plan import OFFICIAL_PLAN

                config = ParallelConfig(ep=2)
                meshes = build_meshes(config.resolve(world), "cpu")
                parallelize(model, meshes, config, OFFICIAL_PLAN, torch.device("cpu"))
            texts = generate_text(model, [text_prompt(k) for k in text_keys[rank]], TOKENS, TEXT)
            images = generate_images(model, [image_prompt(k) for k in image_keys[rank]], TOKENS, IMAGE)
            results[name] = {"text": [a.raw for a in texts], "images": [a.codes for a in images]}
            if name == "fsdp":  # the evaluation's split: items rank, rank + world, ..., gathered back in order
                results["eval_text"] = _sharded([text_prompt(k) for k in eval_keys], lambda ps, m=model: [
                    a.raw for a in generate_text(m, ps, TOKENS, TEXT)])
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
