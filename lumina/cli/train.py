"""`lumina-train`: the Hydra entry point (also `python -m lumina.train`).

Configuration mistakes end the process with one line on stderr and exit status 2; set HYDRA_FULL_ERROR=1
for the full traceback instead. In a multi-process job every rank exits with that status, the line comes
from rank 0 only (the configuration is the same on every rank), and the process group is shut down first,
so no rank aborts at interpreter exit; a failed participation check, and a data-store read that failed after
its retries (`lumina.data.fs.StoreError`), are reported the same way (status 1). `estimate_memory=true` prints the
step-memory estimate of the composed config instead of training (`lumina.cli.memory.report_memory`): exit status 0,
or 2 with one error
line when it exceeds `memory_budget_gib`."""

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
