"""Helpers shared by the sampler tests (a helper module, not conftest: `from conftest import` resolves to
whichever conftest pytest imported first when several test folders are given)."""

from __future__ import annotations

import copy


def record_backbone_packs(model) -> list:
    """Wrap `model.backbone` so every pack it sees is copied into the returned list (the sampler updates its
    pack in place between steps; with a key/value cache the pack holds only the rows the cache does not);
    `del model.backbone` restores the real one."""
    seen = []
    real_backbone = model.backbone

    def recording_backbone(batch, cache=None):
        seen.append(copy.deepcopy(batch))
        return real_backbone(batch, cache)

    model.backbone = recording_backbone
    return seen


def generate(checkpoint, output_dir, overrides: list[str]):
    """`lumina-generate` in this process: the CLI's config composed with `overrides`, then `run(cfg)`."""
    from hydra import compose, initialize_config_dir

    from lumina.cli.train import CONF_DIR
    from lumina.generation.run import run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("generate", overrides=[f"checkpoint={checkpoint}", *overrides])
    cfg.output_dir = str(output_dir)
    return run(cfg)
