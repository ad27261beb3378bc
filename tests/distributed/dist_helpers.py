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

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaConfig

M = -100
HERE = Path(__file__).resolve().parent


def tiny_config(**overrides) -> LuminaConfig:
    return LuminaConfig.tiny(**overrides)


def expert_load(output, num_experts: int) -> torch.Tensor:  # noqa: ANN001 - a LuminaOutput
    """Selections per expert of one forward, int64 [MoE layers, E], from its routing output."""
    return torch.stack([torch.bincount(ids.reshape(-1), minlength=num_experts) for ids in output.router_topk_ids])


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


def block_pack(seed: int, prompt: int = 4, answer: int = 16, block: int = 4, tail: int = 11) -> PackedBatch:
    """A block-diffusion text answer as the layout writes it: a clean prompt (turn 0), the noisy answer in
    `answer // block` blocks (turn 1, the first row of each block supervised) and its clean memory (the same
    rows again, clean, unsupervised, same positions), then a plain `tail`-row text sequence. With the defaults
    (47 rows) the memory of blocks 1-3 lands in the second half of the pack, the noisy blocks in the first."""
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(seed)
    cols = cfg.num_codebooks
    answer_ids = torch.randint(1, cfg.vocab_size, (answer,), generator=gen)
    blocks = torch.arange(answer) // block
    rows = []  # (id, label, type, turn, block, position, clean, noise, answer)
    for i in range(prompt):
        rows.append((int(torch.randint(1, cfg.vocab_size, (1,), generator=gen)), M, 1, 0, -1, i, True, 0.0, False))
    for i in range(answer):  # noisy copy: every row masked (id 1), supervised at the first row of a block
        label = int(answer_ids[i]) if i % block == 0 else M
        rows.append((1, label, 3, 1, int(blocks[i]), prompt + i, False, 0.5, True))
    for i in range(answer):  # clean memory
        rows.append((int(answer_ids[i]), M, 3, 1, int(blocks[i]), prompt + i, True, 0.0, False))
    first = len(rows)
    for i in range(tail):
        label = int(torch.randint(0, cfg.vocab_size, (1,), generator=gen)) if i >= 3 else M
        rows.append((int(torch.randint(1, cfg.vocab_size, (1,), generator=gen)), label, 3 if i >= 3 else 1,
                     int(i >= 3), -1, i, i < 3, 0.5 if i >= 3 else 0.0, i >= 3))
    ids, labels, types, turns, block_ids, pos, clean, noise, answer_mask = zip(*rows, strict=True)
    labels_grid = torch.full((1, len(rows), cols), M)
    labels_grid[0, :, 0] = torch.tensor(labels)
    return PackedBatch(
        input_ids=torch.tensor(ids).view(1, -1, 1).expand(1, len(rows), cols).clone(), labels=labels_grid,
        type_ids=torch.tensor([types]), turn_ids=torch.tensor([turns]), block_ids=torch.tensor([block_ids]),
        position_ids=torch.tensor([pos]), is_clean=torch.tensor([clean]),
        token_valid=torch.ones(1, len(rows), dtype=torch.bool), cu_seqlens=torch.tensor([0, first, len(rows)]),
        noise_t=torch.tensor([noise]), answer_mask=torch.tensor([answer_mask]))


def union(first: PackedBatch, second: PackedBatch) -> PackedBatch:
    """One pack holding both packs' sequences (what one process sees of the global batch)."""
    cat = {name: torch.cat([getattr(first, name), getattr(second, name)], dim=1)
           for name in ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
                        "token_valid", "noise_t", "answer_mask")}
    return PackedBatch(cu_seqlens=torch.cat([first.cu_seqlens, second.cu_seqlens[1:] + first.seq_len]), **cat)


# rank 0: 3 supervised text tokens and no image; rank 1: 60 supervised text tokens and 20 image cells
FEW = [(4, 6, 3, 0, 0)]
MANY = [(3, 24, 20, 12, 10), (2, 22, 20, 12, 10), (2, 20, 20, 0, 0)]
# 56 rows: split over 2 sequence-parallel ranks, rank 0's 28 rows hold text targets only (no image target)
TEXT_THEN_IMAGE = [(4, 30, 20, 0, 0), (2, 6, 4, 14, 10)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(command: list[str], world: int, timeout_s: float = 240.0, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """Run `command` as `world` separate processes with an env:// rendezvous (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_*; Lightning then starts no processes itself); one output per process, all killed on timeout."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(env or os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                        RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(command, env=rank_env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout_s
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{command} did not finish in {timeout_s} s") from None
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, None))
    return results


def launch(scenario: str, out_dir: Path, world: int = 2, timeout_s: float = 240.0) -> list[subprocess.CompletedProcess]:
    """Run `dist_worker.py <scenario> <out_dir>` as `world` gloo ranks."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return launch_ranks([sys.executable, str(HERE / "dist_worker.py"), scenario, str(out_dir)], world, timeout_s,
                        env=env)


def run_scenario(scenario: str, out: Path, expect_ok: bool, world: int = 2,
                 timeout_s: float = 240.0) -> Callable[[str, int], dict]:
    """Launch `scenario` on `world` gloo ranks; the result loads rank r's saved `name` as load(name, r)."""
    results = launch(scenario, out, world=world, timeout_s=timeout_s)
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
