"""Shared pieces of the 2-process distributed tests: packs, their union, launching gloo workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lumina.data.batch import PackedBatch
from lumina.model import LuminaConfig

M = -100
HERE = Path(__file__).resolve().parent


def tiny_config(**overrides) -> LuminaConfig:
    return LuminaConfig.tiny(**overrides)


def make_pack(segments: list[tuple[int, int, int, int, int]], seed: int) -> PackedBatch:
    """segments: (prompt, text, text_sup, image, image_sup) per sequence: a clean type-1 prompt (turn 0), then
    a noisy turn 1 with `text` type-3 rows (the first text_sup supervised) and `image` type-4 rows (the first
    image_sup supervised). No tail padding."""
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(seed)
    cols = cfg.num_codebooks
    ids, labels, types, turns, clean, pos, noise, answer, cu = [], [], [], [], [], [], [], [], [0]
    for prompt, text, text_sup, image, image_sup in segments:
        kinds = [1] * prompt + [3] * text + [4] * image
        for i, kind in enumerate(kinds):
            label = torch.full((cols,), M)
            if kind == 4:
                ids.append(torch.randint(0, cfg.codebook_size, (cols,), generator=gen))
                if i - prompt - text < image_sup:
                    label = torch.randint(0, cfg.codebook_size, (cols,), generator=gen)
            else:
                ids.append(torch.randint(1, cfg.vocab_size, (1,), generator=gen).expand(cols))
                if kind == 3 and i - prompt < text_sup:
                    label[0] = int(torch.randint(0, cfg.vocab_size, (1,), generator=gen))
            labels.append(label)
            types.append(kind)
            turns.append(0 if kind == 1 else 1)
            clean.append(kind == 1)
            pos.append(i)
            noise.append(0.5 if kind == 3 else 0.0)
            answer.append(kind == 3)
        cu.append(cu[-1] + len(kinds))
    seq = len(types)
    return PackedBatch(
        input_ids=torch.stack(ids).unsqueeze(0), labels=torch.stack(labels).unsqueeze(0),
        type_ids=torch.tensor([types]), turn_ids=torch.tensor([turns]),
        block_ids=torch.zeros(1, seq, dtype=torch.long), position_ids=torch.tensor([pos]),
        is_clean=torch.tensor([clean]), token_valid=torch.ones(1, seq, dtype=torch.bool),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32), noise_t=torch.tensor([noise]),
        answer_mask=torch.tensor([answer]))


def union(first: PackedBatch, second: PackedBatch) -> PackedBatch:
    """One pack holding both packs' sequences (what one process sees of the global batch)."""
    cat = {name: torch.cat([getattr(first, name), getattr(second, name)], dim=1)
           for name in ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
                        "token_valid", "noise_t", "answer_mask")}
    return PackedBatch(cu_seqlens=torch.cat([first.cu_seqlens, second.cu_seqlens[1:] + first.seq_len]), **cat)


# rank 0: 3 supervised text tokens and no image; rank 1: 60 supervised text tokens and 20 image cells
FEW = [(4, 6, 3, 0, 0)]
MANY = [(3, 24, 20, 12, 10), (2, 22, 20, 12, 10), (2, 20, 20, 0, 0)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, out_dir: Path, world: int = 2, timeout_s: float = 240.0) -> list[subprocess.CompletedProcess]:
    """Run `dist_worker.py <scenario> <out_dir>` as `world` gloo ranks (env:// rendezvous); kill on timeout."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "dist_worker.py"), scenario, str(out_dir)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout_s
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"distributed scenario {scenario!r} did not finish in {timeout_s} s") from None
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, None))
    return results


def run_scenario(scenario: str, out: Path, expect_ok: bool, world: int = 2) -> Callable[[str, int], dict]:
    """Launch `scenario` on `world` gloo ranks; the result loads rank r's saved `name` as load(name, r)."""
    results = launch(scenario, out, world=world)
    if expect_ok and any(r.returncode != 0 for r in results):
        tails = "\n".join(f"--- rank {i} (exit {r.returncode}) ---\n{r.stdout[-4000:]}" for i, r in enumerate(results))
        pytest.fail(f"distributed scenario {scenario!r} failed:\n{tails}")

    def load(name: str, rank: int) -> dict:
        return torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)
    load.out = out  # type: ignore[attr-defined]
    load.processes = results  # type: ignore[attr-defined]
    return load


def assert_close_by_name(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float = 1e-4,
                         atol: float = 1e-6) -> None:
    """Every tensor of `want` matches the one of the same name in `got`; a failure names the tensor."""
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
