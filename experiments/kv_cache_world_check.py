"""The key/value cache against the full forward on a trained checkpoint: every world-evaluation task's prompts
(`lumina.world.evaluation.build_eval_set`, its samplers and settings), fp32, temperature 0, with
`cache=true` and `cache=false` in one process. Per task: tokens / codes that differ, reference (no-cache)
decisions whose top-2 or re-masking margin is under 1e-5 (near ties, where the two runs may rightly differ),
and the largest logit difference at the decoded rows. `--sampled` adds the world evaluation's own temperatures
(t2i / edit at 1.0, fixed seed): the cached samples must equal the uncached ones.

    python experiments/kv_cache_world_check.py /tmp/rlrun/learns_cpu_1234/hf [--items 64] [--sampled]
        [--dtype float64]

The decisions are recorded through the samplers' own primitives with tests/generation/gen_helpers.py's
`record_decisions` (the same recorder the parity tests use). Figures: experiments/kv_cache.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "generation"))
from gen_helpers import TIE, record_decisions  # noqa: E402

from lumina.generation.assets import load_model  # noqa: E402
from lumina.generation.image import generate_images  # noqa: E402
from lumina.generation.text import generate_text  # noqa: E402
from lumina.world.evaluation import TEXT_TASKS, WorldEvalConfig, build_eval_set  # noqa: E402
from lumina.world.tasks import EDIT, TASKS  # noqa: E402


def settings_of(config: WorldEvalConfig, task: str):  # noqa: ANN201
    """The world evaluation's sampler and settings for `task` (evaluate_world's choice)."""
    if task in TEXT_TASKS:
        return generate_text, config.text
    return generate_images, config.edit_image if task == EDIT.name else config.image


def outputs_of(answers: list) -> list[torch.Tensor]:
    """Each prompt's decoded tokens (text answers: every block, EOA and after included) or codes [h * w, C]."""
    return [torch.tensor(a.raw) if hasattr(a, "raw") else a.codes for a in answers]


def compare(reference: list, cached: list) -> dict:
    """Decision streams of one task without / with the cache -> counts. Streams are compared decision by
    decision up to the first one whose kind or shape differs (after a flipped token the runs diverge)."""
    margins: dict[str, list[int]] = {}
    for kind, _, margin in reference:
        counts = margins.setdefault(kind, [0, 0])
        counts[0] += int((margin < TIE).sum())
        counts[1] += margin.numel()
    worst, relative, compared, diverged = 0.0, 0.0, 0, False
    for (kind, ref, _), (got_kind, got, _) in zip(reference, cached, strict=False):
        if kind != got_kind or (ref is not None and ref.shape != got.shape):
            diverged = True
            break
        if ref is not None:
            diff = (ref.double() - got.double()).abs()
            worst = max(worst, float(diff.max()))
            relative = max(relative, float((diff / ref.double().abs().amax(-1, keepdim=True)).max()))
            compared += 1
    diverged = diverged or len(reference) != len(cached)
    return {"near_ties": margins, "max_logit_diff": worst, "max_relative": relative, "logit_calls": compared, "diverged": diverged}


def check(model, eval_set, task: str, sampler, settings) -> dict:  # noqa: ANN001
    prompts, runs, seconds = eval_set.prompts[task], {}, {}
    for cache in (False, True):
        config = dataclasses.replace(settings, cache=cache)
        start = time.perf_counter()
        with record_decisions() as decisions:
            answers = sampler(model, prompts, eval_set.tokens, config)
        seconds[cache] = time.perf_counter() - start
        runs[cache] = (outputs_of(answers), decisions)
    (ref_out, ref_dec), (got_out, got_dec) = runs[False], runs[True]
    differ = sum(int((a != b).sum()) if a.shape == b.shape else max(a.numel(), b.numel())
                 for a, b in zip(ref_out, got_out, strict=True))
    total = sum(a.numel() for a in ref_out)
    return {"task": task, "prompts": len(prompts), "values": total, "differ": differ,
            "prompts_differ": sum(not torch.equal(a, b) for a, b in zip(ref_out, got_out, strict=True)),
            **compare(ref_dec, got_dec), "seconds_no_cache": seconds[False], "seconds_cache": seconds[True]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--dtype", default="float32", help="float64: the same comparison without fp32 rounding")
    parser.add_argument("--sampled", action="store_true", help="also the evaluation's own temperatures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.checkpoint, device="cpu", dtype=args.dtype)
    base = WorldEvalConfig(num_items=args.items)
    eval_set = build_eval_set(base)
    greedy = dataclasses.replace(base, **{name: dataclasses.replace(getattr(base, name), temperature=0.0)
                                          for name in ("text", "image", "edit_image")})
    modes = [("temperature 0", greedy)] + ([("evaluation temperatures", base)] if args.sampled else [])
    print(f"checkpoint {args.checkpoint}, {args.items} prompts per task, {args.dtype}, 1 thread; tie threshold {TIE}")
    for label, config in modes:
        print(f"-- {label}")
        for task in TASKS:
            sampler, settings = settings_of(config, task)
            r = check(model, eval_set, task, sampler, settings)
            ties = ", ".join(f"{kind} {n} of {total}" for kind, (n, total) in r["near_ties"].items())
            print(f"{r['task']:8s} temperature {settings.temperature}: {r['prompts']} prompts, {r['values']} "
                  f"tokens/codes, differ {r['differ']} (in {r['prompts_differ']} prompts); near ties (of decisions) "
                  f"{ties}; max |logit diff| {r['max_logit_diff']:.2e} (relative to the row's largest "
                  f"|logit| {r['max_relative']:.1e}) over {r['logit_calls']} sampling calls"
                  f"{' (runs diverged)' if r['diverged'] else ''}; "
                  f"{r['seconds_no_cache']:.1f} s without cache, {r['seconds_cache']:.1f} s with", flush=True)


if __name__ == "__main__":
    main()
