"""Forward+backward time of one MoE layer: lumina's path (router -> dispatcher -> grouped experts -> combine)
vs the official non-fused training path (per-expert Linear modules, a boolean-mask gather and write-back per
expert) vs two dense SwiGLUs with the experts' active FLOPs (the floors): the T*k token copies through one
I-wide MLP (what the experts compute, minus routing and permutation), and the T tokens through one k*I-wide
MLP (8x less activation memory on the hidden side). Routed experts only (no shared expert).

    python experiments/bench/moe.py [--tokens 4096] [--repeats 7] [--threads N] [--device cuda --dtype bfloat16]

Prints median seconds per fwd+bwd, loop/lumina (goal >= 5) and lumina/floor for both floors (goal <= 1.25).
All are measured round-robin in one process so machine load hits them alike.

Each candidate's step starts by setting its parameters' gradients to None, as `optimizer.zero_grad()` does.

Measured 2026-12-02 after one routed-experts computation (one grouped SwiGLU for the local and the expert-parallel
path, the CPU block path deleted, the backward reusing its buffers, glibc's defaults), against 7ebad05 with
`against.py --ref 7ebad05 --script-here ... --candidates lumina --repeats 3`, medians of 5 interleaved processes
each, on the 2-core CPU while the host's load fell from ~9 to ~2 (single pairs spread 0.7-1.6x):
  1 thread: 9.90 s vs 9.54 s per fwd+bwd (1.04x); 2 threads: 16.7 s vs 23.9 s (0.70x).
  Keeping freed heap memory (M_MMAP_MAX=0) made the layer 0.81x, but the S = 16,384 step's peak RSS 1.2-1.3x
  (experiments/memory.md).

Measured 2026-12-01 after the fused local path (`LocalDispatcher.run_experts`: gather -> grouped SwiGLU ->
weighted combine in one autograd Function that keeps no [T*k, H] tensor), 2 threads, median of 7:
  back to back on a quiet machine: before 775 ms (1.18x the T*k-copies floor), after 674 ms (0.99x);
  old and new path in one process on the same weights: grouped_mm 722 -> 611 ms, loop backend 776 -> 630 ms.
  (While another training job shared the two cores the figures were meaningless: 15.8 s vs 10.5 s.)

Measured 2026-11-29 (before the fused path) on this 2-core CPU, quiet, fp32, E=64 top-8, H=512, I=256, 4096 tokens (median of 9):
  2 threads, three runs: lumina 672-700 ms, loop 3540-3877 ms -> 5.18x / 5.43x / 5.54x;
    lumina / T*k-copies floor 1.16x / 1.15x / 1.13x; lumina / k*I-wide floor 1.34x / 1.30x / 1.30x.
  1 thread (median of 5): 1172 / 5580 / 1086 / 964 ms -> 4.76x; 1.08x; 1.22x.
Where the time goes: every fresh CPU tensor above glibc's 32 MiB mmap threshold page-faults (about 25 ms per
64 MiB here; small GEMMs cost no more than one large one once their outputs exist). The experts'
`_GroupedSwiGLU` allocates less than the dense layer's autograd (no silu(gate x) copy, gate/up gradients
written in place, chunked temporaries; before it: 726-760 ms, 1.24-1.27x and 4.97-5.10x). What remains over
the k*I-wide floor is what the dispatcher seam materialises at T*k rows (the gathered copies, the expert
outputs, their gradient, the copies' gradient) plus E/k = 8x larger weight gradients.
With glibc told to reuse heap memory instead (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296, 2 threads):
lumina 551 ms, loop 1132 ms, floors 467 / 437 ms -> 2.05x; 1.18x; 1.26x. Most of the loop's 5x deficit above is
its own page faults; transparent huge pages (THP_MEM_ALLOC_ENABLE=1) made lumina slower (944 ms)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from timing import interleaved_medians, synced
from torch import nn

from lumina.model import LuminaConfig, MoE
from lumina.model.mlp import SwiGLU


class OfficialExperts(nn.Module):
    """The official non-fused layout: one SwiGLU MLP of three bias-free Linears per expert (a ModuleList)."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        self.experts = nn.ModuleList()
        for gate, up, down in zip(experts.gate_proj, experts.up_proj, experts.down_proj, strict=True):
            mlp = nn.ModuleDict({"gate_proj": nn.Linear(gate.shape[1], gate.shape[0], bias=False),
                                 "up_proj": nn.Linear(up.shape[1], up.shape[0], bias=False),
                                 "down_proj": nn.Linear(down.shape[1], down.shape[0], bias=False)})
            with torch.no_grad():
                for name, weight in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
                    mlp[name].weight.copy_(weight)
            self.experts.append(mlp)


def boolean_mask_moe(moe: MoE, official: OfficialExperts, x: torch.Tensor) -> torch.Tensor:
    """The official non-fused training path: repeat every token k times, then for every expert select its
    copies with a boolean mask, write the expert's output back through the same mask, and sum the k copies
    weighted by the fp32 routing weights."""
    routing = moe.gate(x)
    top_k = routing.topk_ids.shape[-1]
    flat_ids = routing.topk_ids.reshape(-1)
    copies = x.repeat_interleave(top_k, dim=0)  # [T * k, H]
    y = torch.empty_like(copies)
    for e, mlp in enumerate(official.experts):
        rows = copies[flat_ids == e]
        y[flat_ids == e] = mlp["down_proj"](F.silu(mlp["gate_proj"](rows)) * mlp["up_proj"](rows))
    weighted = y.view(*routing.topk_weights.shape, -1) * routing.topk_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(x.dtype)


CANDIDATES = ("lumina", "boolean-mask loop", "dense, T*k copies", "dense, k*I wide")


def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor,
            params: list[nn.Parameter]) -> Callable[[], None]:
    """One training step's forward+backward of `fn` from a fresh leaf copy of x, timed to the end of its device
    work. It starts by setting the parameters' gradients to None, as `optimizer.zero_grad()` does between steps,
    so each backward writes fresh weight gradients instead of accumulating into the last step's."""
    def step() -> None:
        for param in params:
            param.grad = None
        fn(x.detach().requires_grad_()).backward(grad)
    return synced(step, x.device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="grouped_mm", choices=["grouped_mm", "loop"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES,
                        help="which paths to time (the ratios print where both sides ran)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = LuminaConfig.tiny(hidden_size=512, num_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
                            moe_intermediate_size=256, num_shared_experts=None, moe_backend=args.backend,
                            channel_heads=8)
    torch.manual_seed(0)
    moe = MoE(cfg).to(args.device, dtype)
    k = cfg.num_experts_per_tok
    # two dense SwiGLUs with the experts' active FLOPs: the T*k token copies through one I-wide MLP (what the
    # experts compute, minus routing and permutation), and the T tokens through one k*I-wide MLP
    dense_copies = SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size).to(args.device, dtype)
    dense_wide = SwiGLU(cfg.hidden_size, k * cfg.moe_intermediate_size).to(args.device, dtype)
    x = torch.randn(args.tokens, cfg.hidden_size, device=args.device, dtype=dtype)
    grad = torch.randn_like(x)
    copies = torch.randn(args.tokens * k, cfg.hidden_size, device=args.device, dtype=dtype)
    copies_grad = torch.randn_like(copies)

    def lumina_path(t: torch.Tensor) -> torch.Tensor:
        return moe(t.unsqueeze(0))[0].squeeze(0)  # a view: no zero-filled select gradient

    official = OfficialExperts(moe.experts).to(args.device, dtype)

    def loop_path(t: torch.Tensor) -> torch.Tensor:
        return boolean_mask_moe(moe, official, t)

    candidates = {"lumina": (lumina_path, x, grad, list(moe.parameters())),
                  "boolean-mask loop": (loop_path, x, grad, [*moe.gate.parameters(), *official.parameters()]),
                  "dense, T*k copies": (dense_copies, copies, copies_grad, list(dense_copies.parameters())),
                  "dense, k*I wide": (dense_wide, x, grad, list(dense_wide.parameters()))}
    with torch.no_grad():  # the two MoE paths compute the same function
        tolerance = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(lumina_path(x), loop_path(x), rtol=tolerance, atol=tolerance)
    chosen = {name: fwd_bwd(*candidates[name]) for name in args.candidates}
    med = interleaved_medians(chosen, args.repeats)
    print(f"one MoE layer fwd+bwd: E={cfg.num_experts} top-{cfg.num_experts_per_tok} "
          f"groups {cfg.n_group}/{cfg.topk_group} H={cfg.hidden_size} I={cfg.moe_intermediate_size} "
          f"tokens={args.tokens} backend={args.backend} {args.device} {args.dtype} threads={torch.get_num_threads()} "
          f"(median of {args.repeats})")
    for name, seconds in med.items():
        print(f"  {name:20s} {seconds * 1e3:9.1f} ms")
    if {"lumina", "boolean-mask loop"} <= med.keys():
        print(f"  speed-up vs boolean-mask loop:    {med['boolean-mask loop'] / med['lumina']:.2f}x (goal >= 5)")
    for floor in ("dense, T*k copies", "dense, k*I wide"):
        if {"lumina", floor} <= med.keys():
            print(f"  lumina / {floor + ':':21s} {med['lumina'] / med[floor]:.2f}x (goal <= 1.25)")


if __name__ == "__main__":
    main()
