"""`lumina-train`: the Hydra entry point (also `python -m lumina.train`). Errors are reported as
`lumina.cli.errors` states; in a multi-process job every rank exits with the status, rank 0 prints the line,
and the process group is shut down first. `estimate_memory=true` prints the step-memory estimate instead of
training (`lumina.cli.memory.report_memory`)."""

from __future__ import annotations

import sys

from lumina.cli.errors import CONF_DIR, config_errors, hydra_main, one_line, reported_errors

__all__ = ["CONF_DIR", "config_errors", "main", "one_line", "reported_errors"]


def shut_down_distributed() -> int:
    """Destroy the default process group if one is running (its gloo threads would abort interpreter exit);
    returns this process's global rank (from the launcher's environment when no group runs)."""
    import torch.distributed as dist

    from lumina.distributed.launch import launch_rank

    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        return rank
    return launch_rank()


def _job(cfg) -> None:
    from lumina.cli.memory import memory_budget_gib, report_memory
    from lumina.training.run import run

    memory_budget_gib(cfg)  # a bad budget is reported whether or not the estimate runs
    if cfg.get("estimate_memory", False):
        report_memory(cfg)
    else:
        run(cfg)


def main() -> None:
    from lumina.distributed.launch import rank_overrides

    try:
        sys.argv += rank_overrides(sys.argv[1:])  # one rank of a torchrun / srun job: pinned dir, rank-0 artefacts
    except ValueError as error:
        print(f"lumina-train: error: {error}", file=sys.stderr)
        sys.exit(2)
    hydra_main("lumina-train", "train", _job, before_report=lambda: shut_down_distributed() == 0)


if __name__ == "__main__":
    main()
