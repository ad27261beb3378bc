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

import os
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
FULL_ERROR_ENV = "LUMINA_FULL_ERROR"  # HYDRA_FULL_ERROR as the user set it


def config_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the configuration is wrong" (reported as one line)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lumina.training.errors import ConfigError

    return (ConfigError, HydraException, OmegaConfBaseException, ValueError, FileNotFoundError)


def reported_errors() -> tuple[type[BaseException], ...]:
    """Configuration errors, the participation check's error, and a data-store read that still failed after
    its retry budget (its line names the URL; the last checkpoint resumes once the store is back)."""
    from lumina.data.fs import StoreError
    from lumina.distributed.participation import ParticipationError

    return (*config_errors(), ParticipationError, StoreError)


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


def one_line(error: BaseException) -> str:
    """The error's message on one line (Hydra's multi-line messages joined with ' | ')."""
    text = str(error).split("Config search path:")[0]  # Hydra's search-path listing says nothing new
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines) or type(error).__name__


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    failures: list[BaseException] = []  # configuration errors of the jobs (one per job in a multirun)

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def _app(cfg: DictConfig) -> None:
        from lumina.cli.memory import memory_budget_gib, report_memory
        from lumina.training.run import run

        try:
            memory_budget_gib(cfg)  # a bad budget is reported whether or not the estimate runs
            if cfg.get("estimate_memory", False):
                report_memory(cfg)
            else:
                run(cfg)
        except reported_errors() as error:
            if full_traceback:
                raise
            failures.append(error)  # reported below; Hydra would log a multi-line report

    from lumina.distributed.launch import rank_overrides

    try:
        sys.argv += rank_overrides(sys.argv[1:])  # one rank of a torchrun / srun job: pinned dir, rank-0 artefacts
    except ValueError as error:
        print(f"lumina-train: error: {error}", file=sys.stderr)
        sys.exit(2)
    # the user's choice, kept for the ranks a launcher starts (they inherit the HYDRA_FULL_ERROR set below)
    os.environ.setdefault(FULL_ERROR_ENV, os.environ.get("HYDRA_FULL_ERROR", "0"))
    full_traceback = os.environ[FULL_ERROR_ENV] == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let composition errors reach us instead of Hydra's report
    try:
        _app()
    except reported_errors() as error:
        if full_traceback:
            raise
        failures.append(error)
    if not failures:
        return
    if shut_down_distributed() == 0:
        for error in failures:
            print(f"lumina-train: error: {one_line(error)} (HYDRA_FULL_ERROR=1 shows the traceback)",
                  file=sys.stderr)
    sys.exit(2 if any(isinstance(error, config_errors()) for error in failures) else 1)

if __name__ == "__main__":
    main()
