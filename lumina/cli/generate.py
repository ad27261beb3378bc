"""`lumina-generate`: the Hydra entry point of `lumina.generation.run` (conf/generate.yaml).

Configuration mistakes end the process with one line on stderr and exit status 2, an input on a data store
that still fails after its retries (`lumina.data.fs.StoreError`, naming the URL) with one line and status 1;
set HYDRA_FULL_ERROR=1 for the full traceback instead."""

from __future__ import annotations

import os
import sys

from lumina.cli.train import CONF_DIR, config_errors, one_line


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from lumina.data.fs import StoreError
    from lumina.generation.run import run

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
    def _app(cfg: DictConfig) -> None:
        run(cfg)

    full_traceback = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _app()
    except (*config_errors(), StoreError) as error:
        if full_traceback:
            raise
        print(f"lumina-generate: error: {one_line(error)} (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
        sys.exit(1 if isinstance(error, StoreError) else 2)


if __name__ == "__main__":
    main()
