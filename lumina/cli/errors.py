"""How every console entry point reports a mistake: one line `lumina-xxx: error: ...` on stderr naming the
file, URL, field or value, and exit status 2 for bad input (a configuration, a file, a missing optional
extra), 1 for an outage (a data-store read that failed after its retries, a failed participation check).
`hydra_main` runs a Hydra job this way (`lumina-train`, `lumina-generate`); `report` is the plain form
(`lumina-convert`). HYDRA_FULL_ERROR=1 shows the traceback instead."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
FULL_ERROR_ENV = "LUMINA_FULL_ERROR"  # HYDRA_FULL_ERROR as the user set it (kept for a launcher's ranks)
TRACEBACK_HINT = "(HYDRA_FULL_ERROR=1 shows the traceback)"


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the `pip install` that brings it."""


def config_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the input is wrong" (one line, exit status 2)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lumina.training.errors import ConfigError

    return (ConfigError, HydraException, OmegaConfBaseException, ValueError, FileNotFoundError, FileExistsError,
            NotADirectoryError, IsADirectoryError, PermissionError, MissingExtra)


def outage_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "a service failed" (one line, exit status 1)."""
    from lumina.distributed.participation import ParticipationError
    from lumina.files.fs import StoreError

    return (StoreError, ParticipationError)


def reported_errors() -> tuple[type[BaseException], ...]:
    return (*config_errors(), *outage_errors(), ImportError)


def extra_of(module: str) -> str | None:
    """The optional extra of lumina's package metadata that installs top-level module `module`, if any."""
    top = module.split(".")[0].lower()
    for requirement in importlib.metadata.requires("lumina") or []:
        name, _, marker = requirement.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        distribution = re.split(r"[<>=!~\[ ]", name.strip())[0].lower().replace("-", "_")
        if extra and extra.group(1) != "dev" and distribution == top:
            return extra.group(1)
    return None


def as_reported(error: BaseException) -> BaseException | None:
    """`error` as the CLI reports it, or None for a bug (its traceback shows). An ImportError is reported only
    when it names a `pip install` or its module is one of lumina's optional extras (then the line names it)."""
    if not isinstance(error, ImportError) or isinstance(error, MissingExtra):
        return error if isinstance(error, reported_errors()) else None
    if "pip install" in str(error):
        return MissingExtra(str(error))
    extra = extra_of(error.name or "") if isinstance(error, ModuleNotFoundError) else None
    if extra is None:
        return None
    return MissingExtra(f"{error}: pip install 'lumina[{extra}]'")


@contextmanager
def reporting(prog: str) -> Iterator[None]:
    """The plain (non-Hydra) form: a reported error, or any other OSError (status 1), raised inside the block
    ends the process with one line."""
    try:
        yield
    except (*reported_errors(), OSError) as error:
        reported = as_reported(error) or (error if isinstance(error, OSError) else None)
        if reported is None or full_traceback_wanted():
            raise
        report(prog, [reported])


def exit_status(errors: Sequence[BaseException]) -> int:
    return 2 if any(isinstance(error, config_errors()) for error in errors) else 1


def one_line(error: BaseException) -> str:
    """The error's message on one line (Hydra's multi-line messages joined with ' | ')."""
    text = str(error).split("Config search path:")[0]  # Hydra's search-path listing says nothing new
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines) or type(error).__name__


def report(prog: str, errors: Sequence[BaseException], hint: str = "") -> NoReturn:
    """Print one line per error and exit with `exit_status`."""
    for error in errors:
        print(f"{prog}: error: {one_line(error)}{' ' + hint if hint else ''}", file=sys.stderr)
    sys.exit(exit_status(errors))


def full_traceback_wanted() -> bool:
    """The user's HYDRA_FULL_ERROR=1 (kept in FULL_ERROR_ENV, since `hydra_main` sets HYDRA_FULL_ERROR itself)."""
    os.environ.setdefault(FULL_ERROR_ENV, os.environ.get("HYDRA_FULL_ERROR", "0"))
    return os.environ[FULL_ERROR_ENV] == "1"


def hydra_main(prog: str, config_name: str, job: Callable[[Any], None],
               before_report: Callable[[], bool] = lambda: True) -> None:
    """Run `job(cfg)` on the composed `conf/<config_name>.yaml` as a Hydra app. Reported errors (one per job
    of a multirun) end the process after the last job, one line each; `before_report` says whether this
    process prints them."""
    import hydra

    failures: list[BaseException] = []
    full_traceback = full_traceback_wanted()

    def caught(error: BaseException) -> None:
        reported = as_reported(error)
        if full_traceback or reported is None:
            raise error
        failures.append(reported)

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    def _app(cfg: Any) -> None:
        try:
            job(cfg)
        except reported_errors() as error:
            caught(error)  # reported below; Hydra would log a multi-line report

    os.environ["HYDRA_FULL_ERROR"] = "1"  # let composition errors reach us instead of Hydra's report
    try:
        _app()
    except reported_errors() as error:
        caught(error)
    if not failures:
        return
    if before_report():
        report(prog, failures, TRACEBACK_HINT)
    sys.exit(exit_status(failures))
