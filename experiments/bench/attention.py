"""Packed attention backends: forward+backward speed-up over `sdpa_dense`, next to the ideal S^2 / sum(L_i^2),
and the mask memory each backend keeps at S = 16384.

    python experiments/bench/attention.py [--seq-len 4096] [--heads 16] [--kv-heads 4] [--head-dim 128]

Packs: 16 equal segments, and a realistic length mix; each with block-diffusion metadata (SFT layout:
clean prompt turn, noisy answer blocks, clean answer memory) and plain bidirectional. Timings are medians of
--reps runs after one warm-up, backends interleaved rep by rep in the same process. flex has no backward on CPU,
so there it is timed forward-only (under no_grad) next to the forward-only figures of the others.

Recorded 2026-11-29 (torch 2.13 CPU, `--threads 1 --reps 5`; 2 cores shared with other jobs, so one
thread; 16/4 heads, head dim 128, fp32, S = 4096). Speed-up over sdpa_dense (median s of sdpa_dense):

| pack | ideal | segmented fwd+bwd | segmented fwd | flex fwd |
|---|---|---|---|---|
| 16 equal, block-diffusion rules | 16.00x | 12.92x (23.09 s) | 15.91x (6.56 s) | 7.89x |
| length mix, block-diffusion rules | 5.99x | 6.04x (22.55 s) | 5.49x (5.93 s) | 3.21x |
| 16 equal, plain | 16.00x | 12.67x (20.33 s) | 17.77x (4.81 s) | 11.54x |
| length mix, plain | 5.99x | 6.09x (17.43 s) | 5.54x (4.75 s) | 3.00x |

With torch's default 2 threads (`--reps 3`, contended): segmented fwd+bwd 11.00x of 16 (equal, rules;
sdpa_dense 28.95 s) and 4.18x of 5.99 (mix, rules; 16.04 s); forward 16.17x / 2.50x; flex forward 8.12x / 3.00x.

Mask memory at S = 16384 (fp32): sdpa_dense 1024 MiB; segmented 64.0 MiB (16 equal, = sum(L^2)/S^2 =
0.0625) and 171.0 MiB (mix, 0.167); flex 1.0 MiB (block tables + per-token vectors, 0.001 of dense).
"""

from __future__ import annotations

import argparse

import torch
from timing import interleaved_medians, synced

from lumina.attention import attend, build_spec, register_attend_hook
from lumina.contract import PackedBatch

MIX = (1210, 806, 512, 431, 301, 260, 198, 150, 118, 60, 50)  # realistic mix, sums to 4096 with 0 tail


def sft_rows(length: int, block: int = 32) -> list[tuple[int, int, int, bool]]:
    """(type, turn, block, clean) rows: clean prompt (turn 0) | noisy answer blocks | clean answer memory."""
    prompt = max(1, length // 4)
    answer = (length - prompt) // 2
    memory = length - prompt - answer
    rows = [(1, 0, -1, True)] * prompt
    rows += [(3, 1, i // block, False) for i in range(answer)]
    rows += [(3, 1, i // block, True) for i in range(memory)]
    return rows


def make_pack(lengths: tuple[int, ...], seq_len: int, rules: bool) -> PackedBatch:
    rows = [r for length in lengths for r in sft_rows(length)]
    packed = len(rows)
    rows += [(0, 0, -1, True)] * (seq_len - packed)
    types, turns, blocks, clean = (torch.tensor(c) for c in zip(*rows, strict=True))
    if not rules:  # plain bidirectional segments: one turn, all clean, no blocks
        turns, blocks, clean = torch.zeros_like(turns), torch.full_like(blocks, -1), torch.ones_like(clean)
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return PackedBatch(input_ids=torch.zeros(seq_len, 1, dtype=torch.long), type_ids=types, turn_ids=turns,
                       block_ids=blocks, position_ids=torch.arange(seq_len), is_clean=clean,
                       token_valid=torch.arange(seq_len) < packed, cu_seqlens=torch.tensor(cu),
                       seg_bounds=tuple(cu))


def scaled_mix(seq_len: int) -> tuple[int, ...]:
    scale = seq_len / sum(MIX)
    lengths = [max(8, round(x * scale)) for x in MIX]
    lengths[0] += seq_len - sum(lengths)
    return tuple(lengths)


def bench_pack(name: str, batch: PackedBatch, args, backends: list[str]) -> None:
    seq_len = batch.seq_len
    lengths = [b - a for a, b in zip(batch.seg_bounds, batch.seg_bounds[1:], strict=False)]
    ideal = seq_len**2 / sum(x * x for x in lengths)
    g = torch.Generator().manual_seed(0)
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    batch = batch.to(device)
    # token-major memory, as a fused QKV projection viewed [B, S, h, hd] and transposed gives it
    q = torch.randn(1, seq_len, args.heads, args.head_dim, generator=g).to(device, dtype).transpose(1, 2)
    k = torch.randn(1, seq_len, args.kv_heads, args.head_dim, generator=g).to(device, dtype).transpose(1, 2)
    v = torch.randn(1, seq_len, args.kv_heads, args.head_dim, generator=g).to(device, dtype).transpose(1, 2)
    upstream = torch.randn(q.shape, generator=g).to(device, dtype)

    def fwd_bwd(backend: str):
        spec = build_spec(batch, backend=backend, strict=True)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def step():
            torch.autograd.grad((attend(*leaves, spec) * upstream).sum(), leaves)
        return step

    def fwd(backend: str):
        spec = build_spec(batch, backend=backend, strict=True)

        def step():
            with torch.no_grad():
                attend(q, k, v, spec)
        return step

    print(f"\n## {name}: S={seq_len}, {len(lengths)} segments, ideal speed-up S^2/sum(L^2) = {ideal:.2f}x")
    print("| backend | fwd+bwd median s | fwd+bwd speed-up | fwd-only median s | fwd-only speed-up |")
    print("|---|---|---|---|---|")
    trainable = [b for b in backends if b != "flex" or device.type == "cuda"]
    served: set[str] = set()  # the backend that served each attend call (strict: never a fallback)
    hook = register_attend_hook(lambda call: served.add(call.served))
    train = interleaved_medians({b: synced(fwd_bwd(b), device) for b in trainable}, args.reps)
    forward = interleaved_medians({b: synced(fwd(b), device) for b in backends}, args.reps)
    hook.remove()
    assert served == set(backends), f"not every backend served its own calls: {served}"
    for backend in backends:
        train_cell, train_up = "n/a (no CPU backward)", ""
        if backend in train:
            train_cell = f"{train[backend]:.3f}"
            train_up = f"{train['sdpa_dense'] / train[backend]:.2f}x"
        print(f"| {backend} | {train_cell} | {train_up} | {forward[backend]:.3f} | "
              f"{forward['sdpa_dense'] / forward[backend]:.2f}x |", flush=True)


def mask_bytes(seq_len: int, dtype: torch.dtype) -> None:
    """Mask memory each backend keeps per forward (dense: computed, not allocated)."""
    element = torch.finfo(dtype).bits // 8
    print(f"\n## mask memory at S={seq_len} ({dtype})")
    print("| pack | sdpa_dense | segmented | flex | segmented/dense | sum(L^2)/S^2 | flex/dense |")
    print("|---|---|---|---|---|---|---|")
    for name, lengths in [("16 equal", (seq_len // 16,) * 16), ("mix", scaled_mix(seq_len))]:
        batch = make_pack(lengths, seq_len, rules=True)
        dense = seq_len * seq_len * element
        spec = build_spec(batch, backend="segmented")
        from lumina.attention.backends import flex, segmented

        seg = sum(m.numel() * element for m in segmented.run_masks(spec, dtype) if m is not None)
        block_mask = flex.build_block_mask(spec)
        tables = [block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
                  block_mask.full_kv_indices, block_mask.q_num_blocks, block_mask.q_indices,
                  block_mask.full_q_num_blocks, block_mask.full_q_indices]
        vectors = 6 * seq_len * 8  # seg, valid, clean, turn, block, type (int64 upper bound)
        fl = sum(t.numel() * t.element_size() for t in tables if t is not None) + vectors
        share = sum(x * x for x in lengths) / seq_len**2
        print(f"| {name} | {dense / 2**20:.1f} MiB | {seg / 2**20:.2f} MiB | {fl / 2**20:.3f} MiB | "
              f"{seg / dense:.4f} | {share:.4f} | {fl / dense:.5f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--mask-seq-len", type=int, default=16384)
    parser.add_argument("--backends", default="sdpa_dense,segmented,flex")
    parser.add_argument("--packs", default="equal-rules,mix-rules,equal-plain,mix-plain")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, heads {args.heads}/{args.kv_heads}, "
          f"head dim {args.head_dim}, {args.dtype}, median of {args.reps}")
    backends = args.backends.split(",")
    s = args.seq_len
    packs = {
        "equal-rules": ("16 equal segments, block-diffusion rules", (s // 16,) * 16, True),
        "mix-rules": ("length mix, block-diffusion rules", scaled_mix(s), True),
        "equal-plain": ("16 equal segments, plain bidirectional", (s // 16,) * 16, False),
        "mix-plain": ("length mix, plain bidirectional", scaled_mix(s), False),
    }
    for key in args.packs.split(","):
        title, lengths, rules = packs[key]
        bench_pack(title, make_pack(lengths, s, rules), args, backends)
    mask_bytes(args.mask_seq_len, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
