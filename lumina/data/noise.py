"""Seeded noise for training sequences: text-answer masking, image-answer masking, CFG dropout. How much is
masked at a noise level is the masking schedule's (`NoiseConfig.schedule`, a `lumina.schedules` part).

Masking draws come from a `torch.Generator` seeded by a stable hash of (seed, epoch, sample id, stream): the
same in every process and on every resume. The CFG-dropout coins, needed for every sample at every epoch
start, are counter-based: splitmix64(id hash ^ key(seed, epoch, stream)) as a uniform in [0, 1), the id hash
being splitmix64 of FNV-1a-64 of the id's UTF-8 bytes; one kernel draws them for the layout and the plan.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numba
import numpy as np
import pyarrow as pa
import torch

from lumina.schedules import DEFAULT_SCHEDULE, MaskingSchedule, build_schedule


@dataclass(frozen=True)
class NoiseConfig:
    """block_length: text-answer block size (block id = answer offset // block_length).
    t_min, t_max: range of the text mask probability t ~ U[t_min, t_max].
    t_per: draw t once per answer block ("block") or once per sample ("sample").
    uncond_text_prob / uncond_image_prob: CFG dropout of an image-answer sample's user text / source media."""

    block_length: int = 32
    t_min: float = 1e-3
    t_max: float = 1.0
    t_per: Literal["block", "sample"] = "block"
    uncond_text_prob: float = 0.1
    uncond_image_prob: float = 0.1
    schedule: str = DEFAULT_SCHEDULE

    def __post_init__(self) -> None:
        self.masking  # noqa: B018 - a bad schedule name fails here, naming the field
        if self.block_length <= 0:
            raise ValueError(f"NoiseConfig.block_length={self.block_length}: must be positive")
        if not 0.0 <= self.t_min <= self.t_max <= 1.0:
            raise ValueError(f"NoiseConfig t_min={self.t_min}, t_max={self.t_max}: "
                             f"need 0 <= t_min <= t_max <= 1")
        if self.t_per not in ("block", "sample"):
            raise ValueError(f"NoiseConfig.t_per={self.t_per!r}: expected 'block' or 'sample'")
        for name in ("uncond_text_prob", "uncond_image_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"NoiseConfig.{name}={getattr(self, name)}: must lie in [0, 1]")

    @cached_property
    def masking(self) -> MaskingSchedule:
        """The `schedule` part."""
        return build_schedule(self.schedule, "NoiseConfig.schedule")


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' text (blake2b; unlike hash(), the same in every process)."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def sample_generator(seed: int, epoch: int, sample_id: str, stream: str) -> torch.Generator:
    """The CPU generator for one (seed, epoch, sample, stream); streams ("noise", "cfg") are independent."""
    gen = torch.Generator()
    gen.manual_seed(stable_seed(seed, epoch, sample_id, stream))
    return gen


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


@numba.njit(cache=True, nogil=True, inline="always")
def _mix64(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijection of 64-bit words that spreads every input bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _hash_strings(offsets: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
    """out[i] = mix64(FNV-1a-64 of data[offsets[i]:offsets[i + 1]])."""
    for i in range(out.size):
        h = _FNV_OFFSET
        for b in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[b])) * _FNV_PRIME
        out[i] = _mix64(h)


def id_hashes(ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> np.ndarray:
    """[N] uint64 hashes of sample ids (Arrow strings or Python str), from Arrow's buffers."""
    if not isinstance(ids, pa.Array | pa.ChunkedArray):
        ids = pa.array(ids, pa.large_string())
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    out = np.empty(len(ids), np.uint64)
    start = 0
    for chunk in chunks:
        chunk = chunk.cast(pa.large_string())
        if chunk.null_count:
            raise ValueError(f"sample ids hold {chunk.null_count} nulls")
        _, offsets, data = chunk.buffers()
        offsets = np.frombuffer(offsets, np.int64)[chunk.offset:chunk.offset + len(chunk) + 1]
        data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        _hash_strings(offsets, data, out[start:start + len(chunk)])
        start += len(chunk)
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _variant(h: np.uint64, text_key: np.uint64, image_key: np.uint64, text_prob: float,
             image_prob: float) -> int:
    """The stored length variant (drop_text + 2 * drop_image) of the sample with id hash h."""
    scale = 1.0 / 9007199254740992.0  # 2 ** -53: the top 53 bits as a uniform in [0, 1)
    drop_text = float(_mix64(h ^ text_key) >> np.uint64(11)) * scale < text_prob
    drop_image = float(_mix64(h ^ image_key) >> np.uint64(11)) * scale < image_prob
    return int(drop_text) + 2 * int(drop_image)


@numba.njit(cache=True, nogil=True)
def _variants(hashes: np.ndarray, text_key: np.uint64, image_key: np.uint64, text_prob: float,
              image_prob: float) -> np.ndarray:
    out = np.empty(hashes.size, np.uint8)
    for i in range(hashes.size):
        out[i] = _variant(hashes[i], text_key, image_key, text_prob, image_prob)
    return out


@numba.njit(cache=True, nogil=True)
def _pick_lengths(stored: np.ndarray, hashes: np.ndarray, text_key: np.uint64, image_key: np.uint64,
                  text_prob: float, image_prob: float) -> np.ndarray:
    out = np.empty(hashes.size, np.int32)
    for i in range(hashes.size):
        out[i] = stored[i, _variant(hashes[i], text_key, image_key, text_prob, image_prob)]
    return out


def _coin_keys(seed: int, epoch: int) -> tuple[np.uint64, np.uint64]:
    return np.uint64(stable_seed(seed, epoch, "cfg-text")), np.uint64(stable_seed(seed, epoch, "cfg-image"))


def cfg_dropout(seed: int, epoch: int, sample_id: str, cfg: NoiseConfig) -> tuple[bool, bool]:
    """(drop_text, drop_image): two independent seeded coins."""
    variant = int(_variants(id_hashes([sample_id]), *_coin_keys(seed, epoch), cfg.uncond_text_prob,
                            cfg.uncond_image_prob)[0])
    return bool(variant & 1), bool(variant & 2)


def dropout_lengths(stored: np.ndarray, hashes: np.ndarray, cfg: NoiseConfig, seed: int, epoch: int) -> np.ndarray:
    """Stored lengths [N, 4], id hashes [N] -> [N] int32 lengths under `cfg_dropout(seed, epoch, id)`."""
    if stored.ndim != 2 or stored.shape != (hashes.size, 4):
        raise ValueError(f"stored lengths have shape {list(stored.shape)}, expected [{hashes.size}, 4]")
    return _pick_lengths(np.ascontiguousarray(stored), hashes, *_coin_keys(seed, epoch), cfg.uncond_text_prob,
                         cfg.uncond_image_prob)


def text_answer_noise(lengths: list[int], cfg: NoiseConfig, gen: torch.Generator,
                      fixed_t: float | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per text answer of one sample (tokens incl. EOA): (masked [n] bool, t [n] float32). Each token is
    masked with the schedule's p(t), t ~ U[t_min, t_max] per block or sample (or `fixed_t`); every block
    (t_per="block") or answer (t_per="sample") gets at least one masked token.
    """
    if fixed_t is not None and not 0.0 <= fixed_t <= 1.0:
        raise ValueError(f"fixed_t={fixed_t}: must lie in [0, 1]")
    sample_t = None
    if cfg.t_per == "sample":
        sample_t = fixed_t if fixed_t is not None else _uniform_t(1, cfg, gen).item()
    out = []
    for n in lengths:
        if n <= 0:
            raise ValueError(f"text answer length {n}: must be positive")
        num_blocks = math.ceil(n / cfg.block_length)
        block_of = torch.arange(n) // cfg.block_length
        if sample_t is not None:
            t = torch.full((n,), sample_t, dtype=torch.float32)
            unit_of, num_units = torch.zeros(n, dtype=torch.long), 1
        else:
            per_block = (torch.full((num_blocks,), fixed_t, dtype=torch.float32) if fixed_t is not None
                         else _uniform_t(num_blocks, cfg, gen))
            t = per_block[block_of]
            unit_of, num_units = block_of, num_blocks
        masked = torch.rand(n, generator=gen) < cfg.masking.text_mask_prob(t)
        out.append((_at_least_one_per_unit(masked, unit_of, num_units, gen), t))
    return out


def image_mask_count(num_cells: int, cfg: NoiseConfig, gen: torch.Generator,
                     fixed_ratio: float | None = None) -> int:
    """Cells to mask of `num_cells`: ceil(gamma(r) * N) clamped to [1, N], r ~ U[0, 1), gamma the schedule's
    image mask ratio (`fixed_ratio` replaces gamma(r))."""
    if num_cells <= 0:
        raise ValueError(f"num_cells={num_cells}: must be positive")
    if fixed_ratio is None:
        s = torch.rand(1, generator=gen, dtype=torch.float64).item()
        ratio = cfg.masking.image_mask_ratio(s)
    elif 0.0 <= fixed_ratio <= 1.0:
        ratio = fixed_ratio
    else:
        raise ValueError(f"fixed_ratio={fixed_ratio}: must lie in [0, 1]")
    return min(num_cells, max(1, math.ceil(ratio * num_cells)))


def image_answer_noise(num_cells: int, cfg: NoiseConfig, gen: torch.Generator,
                       fixed_ratio: float | None = None) -> torch.Tensor:
    """[num_cells] bool: exactly `image_mask_count` cells masked, chosen uniformly without replacement."""
    count = image_mask_count(num_cells, cfg, gen, fixed_ratio)
    masked = torch.zeros(num_cells, dtype=torch.bool)
    masked[torch.randperm(num_cells, generator=gen)[:count]] = True
    return masked


def _uniform_t(n: int, cfg: NoiseConfig, gen: torch.Generator) -> torch.Tensor:
    return cfg.t_min + (cfg.t_max - cfg.t_min) * torch.rand(n, generator=gen)


def _at_least_one_per_unit(masked: torch.Tensor, unit_of: torch.Tensor, num_units: int,
                           gen: torch.Generator) -> torch.Tensor:
    """Mask one uniformly chosen token in every unit that has none (units are contiguous)."""
    counts = torch.bincount(unit_of[masked], minlength=num_units)
    sizes = torch.bincount(unit_of, minlength=num_units)
    starts = torch.cumsum(sizes, 0) - sizes
    picks = starts + (torch.rand(num_units, generator=gen) * sizes).long().clamp(max=sizes - 1)
    empty = counts == 0
    masked = masked.clone()
    masked[picks[empty]] = True
    return masked
