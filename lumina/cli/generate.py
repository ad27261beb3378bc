"""`lumina-generate`: the Hydra entry point of `lumina.generation.run` (conf/generate.yaml).

Mistakes end the process as every entry point's do (`lumina.cli.errors`): one line on stderr naming the
file, field or value, exit status 2 for bad input, 1 for an input on a data store that still fails after its
retries; HYDRA_FULL_ERROR=1 shows the traceback instead."""

from __future__ import annotations

from lumina.cli.errors import hydra_main


def _job(cfg) -> None:
    from lumina.generation.run import run

    run(cfg)


def main() -> None:
    hydra_main("lumina-generate", "generate", _job)


if __name__ == "__main__":
    main()
