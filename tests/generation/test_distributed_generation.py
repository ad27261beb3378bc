"""Two gloo processes, FSDP2 (`fully_shard` per decoder layer + root) and lumina's FSDP2 + expert-parallel plan
(all-to-all MoE dispatch): ranks with different numbers of prompts whose answers end at different blocks finish
(no collective desync) and sample with the key/value cache (the worker's configs) exactly what one process
samples without it (`cache=false`, the reference); the world evaluation's item split
(`_sharded`) gathers every rank's answers back in order."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import torch.multiprocessing as mp
from generation_dist_worker import IMAGE, TEXT, TOKENS, eoa_prone_model, image_prompt, run_worker, text_prompt

from lumina.generation import generate_images, generate_text

WORLD = 2
NO_CACHE_TEXT, NO_CACHE_IMAGE = (dataclasses.replace(config, cache=False) for config in (TEXT, IMAGE))
assert TEXT.cache and IMAGE.cache  # the ranks sample with the cache
TIMEOUT_S = 180.0


def test_fsdp2_ranks_stopping_at_different_blocks_complete(tmp_path):
    model = eoa_prone_model()
    candidates = list(range(6))
    reference = {k: a.raw for k, a in zip(candidates, generate_text(model, [text_prompt(k) for k in candidates],
                                                                      TOKENS, NO_CACHE_TEXT), strict=True)}
    blocks = {k: len(raw) // TEXT.block_length for k, raw in reference.items()}
    early = min(candidates, key=lambda k: (blocks[k], k))
    late = max(candidates, key=lambda k: (blocks[k], -k))
    other = next(k for k in candidates if k not in (early, late))
    assert blocks[early] < blocks[late]  # the ranks really stop at different blocks
    text_keys = [[early], [late, other]]  # rank 0: one prompt, done early; rank 1: two prompts
    image_keys = [[0], [1, 2]]
    eval_keys = [early, late, other]  # the evaluation's share: rank 0 items 0 and 2, rank 1 item 1
    image_reference = {k: a.codes for k, a in zip([0, 1, 2], generate_images(
        model, [image_prompt(k) for k in (0, 1, 2)], TOKENS, NO_CACHE_IMAGE), strict=True)}

    ctx = mp.start_processes(run_worker, args=(WORLD, str(tmp_path / "init"), str(tmp_path), text_keys, image_keys,
                                                   eval_keys),
                             nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail(f"2-process FSDP2 generation did not finish in {TIMEOUT_S} s (collective desync)")
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for name in ("fsdp", "fsdp_ep"):
            out = results[name]
            assert out["text"] == [reference[k] for k in text_keys[rank]], name
            for codes, k in zip(out["images"], image_keys[rank], strict=True):
                assert torch.equal(codes, image_reference[k]), name
        assert results["eval_text"] == [reference[k] for k in eval_keys]  # every rank holds all, in order
