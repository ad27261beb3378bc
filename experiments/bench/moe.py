"""Forward+backward time of one MoE layer: lumina's path (router -> dispatcher -> grouped experts -> combine)
vs the official non-fused training path (loop over all experts with boolean masks) vs a dense SwiGLU of the
same active FLOPs (the floor). Routed experts only (no shared expert) in all three.

    python experiments/bench/moe.py [--tokens 4096] [--repeats 7] [--backend grouped_mm]

Prints median seconds per fwd+bwd and the ratios loop/lumina (goal >= 5) and lumina/floor (goal <= 1.25).
The three are measured round-robin in one process so machine load hits them alike. On a CPU shared with
other busy processes, OpenMP barriers dominate small matmuls at 2+ threads; `--threads 1` then gives the
representative figures.

Measured (2026-11-29, this 2-core CPU, quiet): 2 threads, median of 7: lumina 837 ms, loop 3857 ms, floor 521 ms
-> 4.61x vs loop, 1.61x of floor; 1 thread, median of 5: 1419 / 6151 / 972 ms -> 4.34x, 1.46x. The grouped
GEMMs alone take about 1.1x the floor's GEMM time; the rest is permutation, combine and routing."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lumina.model import LuminaConfig, MoE
from lumina.model.mlp import SwiGLU


def boolean_mask_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The official non-fused training path: repeat every token k times, then for every expert select its
    copies with a boolean mask, write the expert's output back through the same mask, and sum the k weighted
    copies of each token."""
    routing = moe.gate(x)
    experts = moe.experts
    top_k = routing.topk_ids.shape[-1]
    flat_ids = routing.topk_ids.reshape(-1)
    copies = x.repeat_interleave(top_k, dim=0)  # [T * k, H]
    y = torch.empty_like(copies)
    # one weight set per expert, as the official ModuleList of per-expert Linears
    weights = zip(experts.gate_proj.unbind(0), experts.up_proj.unbind(0), experts.down_proj.unbind(0), strict=True)
    for e, (gate, up, down) in enumerate(weights):
        mask = flat_ids == e
        rows = copies[mask]
        y[mask] = F.linear(F.silu(F.linear(rows, gate)) * F.linear(rows, up), down)
    weighted = y.view(-1, top_k, x.shape[-1]) * routing.topk_weights.reshape(-1, top_k, 1).to(x.dtype)
    return weighted.sum(dim=1)


def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> float:
    x = x.detach().requires_grad_()
    start = time.perf_counter()
    fn(x).backward(grad)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="grouped_mm", choices=["grouped_mm", "loop"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = LuminaConfig.tiny(hidden_size=512, num_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
                            moe_intermediate_size=256, num_shared_experts=None, moe_backend=args.backend,
                            channel_heads=8)
    torch.manual_seed(0)
    moe = MoE(cfg)
    dense = SwiGLU(cfg.hidden_size, cfg.num_experts_per_tok * cfg.moe_intermediate_size)
    x = torch.randn(args.tokens, cfg.hidden_size)
    grad = torch.randn_like(x)

    def lumina_path(t: torch.Tensor) -> torch.Tensor:
        return moe(t.unsqueeze(0))[0][0]

    candidates = {"lumina": lumina_path, "boolean-mask loop": lambda t: boolean_mask_moe(moe, t), "dense floor": dense}
    with torch.no_grad():  # the two MoE paths compute the same function
        torch.testing.assert_close(lumina_path(x), boolean_mask_moe(moe, x), rtol=1e-4, atol=1e-4)
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for fn in candidates.values():  # warm-up
        fwd_bwd(fn, x, grad)
    for _ in range(args.repeats):
        for name, fn in candidates.items():
            times[name].append(fwd_bwd(fn, x, grad))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"one MoE layer fwd+bwd: E={cfg.num_experts} top-{cfg.num_experts_per_tok} "
          f"groups {cfg.n_group}/{cfg.topk_group} H={cfg.hidden_size} I={cfg.moe_intermediate_size} "
          f"tokens={args.tokens} backend={args.backend} threads={torch.get_num_threads()} "
          f"(median of {args.repeats})")
    for name, seconds in med.items():
        print(f"  {name:18s} {seconds * 1e3:9.1f} ms")
    print(f"  speed-up vs boolean-mask loop: {med['boolean-mask loop'] / med['lumina']:.2f}x (goal >= 5)")
    print(f"  lumina / dense floor:          {med['lumina'] / med['dense floor']:.2f}x (goal <= 1.25)")


if __name__ == "__main__":
    main()
