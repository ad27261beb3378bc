"""Helpers shared by the sampler tests (a helper module, not conftest: `from conftest import` resolves to
whichever conftest pytest imported first when several test folders are given)."""

from __future__ import annotations

import contextlib
import copy
import math

import torch


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


TIE = 1e-5  # decisions closer than this in the reference run may flip under another summation order


@contextlib.contextmanager
def record_decisions():
    """Record, through the samplers' own primitives (called through unchanged), every decision a run makes:
    ("logits", logits [N, V], argmax-margin [N]) for each token draw, ("commit", None, margin [P]) for each
    text commit choice (on log-confidence) and ("remask", None, margin [1]) for each image re-masking cut (its
    score is a log-confidence). A margin is the gap between the chosen side and the nearest value on the other
    side of the decision."""
    import lumina.generation.image as image_mod
    import lumina.generation.text as text_mod

    seen = []
    real_sample, real_commits, real_remask = text_mod.sample_tokens, text_mod._choose_commits, image_mod.remask_lowest

    def sample(logits, *args, **kwargs):
        top2 = torch.topk(logits.double(), 2, dim=-1).values if logits.shape[-1] > 1 else None
        margin = top2[:, 0] - top2[:, 1] if top2 is not None else torch.full((logits.shape[0],), float("inf"))
        seen.append(("logits", logits.detach().clone(), margin))
        return real_sample(logits, *args, **kwargs)

    def commits(masked, confidence, count, threshold):
        full = torch.full(masked.shape, float("nan"), dtype=torch.float64)
        full[masked.cpu()] = confidence.cpu().double().log()  # log scale: a logit error d moves it by <= 2d
        margins = []
        for row in full:
            values = torch.sort(row[~row.isnan()], descending=True).values
            k = min(count, values.numel())
            if 0 < k < values.numel():
                margins.append(float(values[k - 1] - values[k]))
            if threshold is not None and values.numel():
                margins.append(float((values - math.log(threshold)).abs().min()))
        seen.append(("commit", None, torch.tensor(margins, dtype=torch.float64)))
        return real_commits(masked, confidence, count, threshold)

    def remask(score, keep):
        values = torch.sort(score.double()).values
        cut = min(max(keep, 0), values.numel() - 1)
        if 0 < cut:
            seen.append(("remask", None, (values[cut] - values[cut - 1]).reshape(1).cpu()))
        return real_remask(score, keep)

    text_mod.sample_tokens, text_mod._choose_commits = sample, commits
    image_mod.sample_tokens, image_mod.remask_lowest = sample, remask
    try:
        yield seen
    finally:
        text_mod.sample_tokens, text_mod._choose_commits = real_sample, real_commits
        image_mod.sample_tokens, image_mod.remask_lowest = real_sample, real_remask


def compare_decisions(reference: list, cached: list, atol: float = TIE) -> int:
    """Both runs made the same sequence of decisions with logits within `atol`; returns the number of
    reference decisions whose margin is under TIE (where the two runs could rightly differ)."""
    assert [kind for kind, _, _ in cached] == [kind for kind, _, _ in reference]
    near_ties = 0
    for (kind, ref_logits, margin), (_, got_logits, _) in zip(reference, cached, strict=True):
        if kind == "logits":
            assert got_logits.shape == ref_logits.shape
            torch.testing.assert_close(got_logits, ref_logits, atol=atol, rtol=0)
        near_ties += int((margin < TIE).sum())
    return near_ties
