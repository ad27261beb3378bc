"""`lumina-train`: the Hydra entry point (also `python -m lumina.train`).

Configuration mistakes end the process with one line on stderr and exit status 2; set HYDRA_FULL_ERROR=1
for the full traceback instead. `estimate_memory=true` prints the step-memory estimate of the composed config
instead of training (`lumina.training.memory_estimate.report_memory`): exit status 0, or 2 with one error
line when it exceeds `memory_budget_gib`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def config_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the configuration is wrong" (reported as one line)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lumina.training.errors import ConfigError

    return (ConfigError, HydraException, OmegaConfBaseException, ValueError, FileNotFoundError)


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
        from lumina.training.memory_estimate import memory_budget_gib, report_memory
        from lumina.training.run import run

        try:
            memory_budget_gib(cfg)  # a bad budget is reported whether or not the estimate runs
            if cfg.get("estimate_memory", False):
                report_memory(cfg)
            else:
                run(cfg)
        except config_errors() as error:
            if full_traceback:
                raise
            failures.append(error)  # reported below; Hydra would log a multi-line report

    from lumina.distributed.launch import rank_overrides

    try:
        sys.argv += rank_overrides(sys.argv[1:])  # one rank of a torchrun / srun job: pinned dir, rank-0 artefacts
    except ValueError as error:
        print(f"lumina-train: error: {error}", file=sys.stderr)
        sys.exit(2)
    full_traceback = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let composition errors reach us instead of Hydra's report
    try:
        _app()
    except config_errors() as error:
        if full_traceback:
            raise
        failures.append(error)
    for error in failures:
        print(f"lumina-train: error: {one_line(error)} (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
    if failures:
        sys.exit(2)

if __name__ == "__main__":
    main()
