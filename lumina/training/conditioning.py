"""Does the model use its input? Per task, the held-out loss next to a baseline that ignores the input.

Each task's held-out samples (`task_of`) are scored as they are (`<task>/loss`, `acc`) and without the input
their answer depends on (`loss_ignoring`, `acc_ignoring`; understand / edit: the next sample's media, t2i:
`<uncondition>` text). `<task>/gain` = loss_ignoring - loss, about 0 for a model ignoring its input, and per
codebook `gain/cb<c>`: an over-fitting model loses its total gain while the first codebook still follows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import lightning as L
import torch
from torch import nn

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.tasks import EDIT, T2I, UNDERSTAND, task_of
from lumina.data.noise import NoiseConfig
from lumina.data.packing import collate_pack
from lumina.data.sequence_layout import layout_eval
from lumina.data.sources import LayoutSource
from lumina.objective import LuminaObjective
from lumina.objective.held_out import HeldOutLoss

log = logging.getLogger(__name__)

INPUT_OF = {UNDERSTAND.name: "image swapped", EDIT.name: "image swapped", T2I.name: "prompt dropped"}


def ignoring_input(sample: Sample, task: str, other: Sample, tokens: SpecialTokens) -> Sample:
    """`sample` without the input its answer depends on; `other`: the donor of the swapped media."""
    *head, user, answer = sample.turns
    if task == T2I.name:
        parts: list = [Text([tokens.uncondition])]
    else:
        donor = next(p for t in other.turns[:-1] for p in t.parts if isinstance(p, Media))
        parts = [donor if isinstance(p, Media) else p for p in user.parts]
    return dataclasses.replace(sample, turns=[*head, Turn(user.role, parts), answer])


@torch.no_grad()
def pack_scores(model: nn.Module, objective: LuminaObjective, samples: Sequence[Sample], tokens: SpecialTokens,
                num_codebooks: int, noise: NoiseConfig, seed: int, t: float,
                seq_len: int) -> tuple[float, float, list[float]]:
    """(loss, answer-token accuracy, image loss per codebook [C]) of `samples` laid out by `layout_eval` in
    packs of at most `seq_len` tokens, averaged by `HeldOutLoss`."""
    device = next(model.parameters()).device
    packs: list[list] = [[]]
    for seq in (layout_eval(s, tokens, noise, seed, t) for s in samples):
        if packs[-1] and sum(len(q) for q in packs[-1]) + len(seq) > seq_len:
            packs.append([])
        packs[-1].append(seq)
    held_out = HeldOutLoss(num_codebooks)
    for pack in packs:
        batch = collate_pack(pack, sum(len(q) for q in pack), tokens.pad, num_codebooks).to(device)
        held_out.add(objective(model(batch), batch))
    return held_out.scores()


def conditioning_scores(model: nn.Module, objective: LuminaObjective, samples: Sequence[Sample],
                        tokens: SpecialTokens, num_codebooks: int, noise: NoiseConfig, seed: int, t: float,
                        num_items: int, seq_len: int) -> dict[str, float]:
    """The module docstring's metrics over the first `num_items` samples of each task in `samples`."""
    by_task: dict[str, list[Sample]] = {}
    for sample in samples:
        task = task_of(sample)
        if task is not None and len(by_task.setdefault(task, [])) < num_items:
            by_task[task].append(sample)
    out: dict[str, float] = {}
    for task, chosen in sorted(by_task.items()):
        args = (tokens, num_codebooks, noise, seed, t, seq_len)
        out[f"{task}/loss"], out[f"{task}/acc"], codebooks = pack_scores(model, objective, chosen, *args)
        if task in INPUT_OF and len(chosen) >= 2:
            ignoring = [ignoring_input(s, task, chosen[(i + 1) % len(chosen)], tokens) for i, s in enumerate(chosen)]
            out[f"{task}/loss_ignoring"], out[f"{task}/acc_ignoring"], codebooks_ignoring = pack_scores(
                model, objective, ignoring, *args)
            out[f"{task}/gain"] = out[f"{task}/loss_ignoring"] - out[f"{task}/loss"]
            for c, (with_input, without) in enumerate(zip(codebooks, codebooks_ignoring, strict=True)):
                out[f"{task}/loss_ignoring/cb{c}"] = without
                out[f"{task}/gain/cb{c}"] = without - with_input
    return out


def per_codebook(scores: dict[str, float], key: str) -> list[float]:
    """[scores[f"{key}/cb0"], scores[f"{key}/cb1"], ...] (empty for a task answered by text)."""
    values: list[float] = []
    while f"{key}/cb{len(values)}" in scores:
        values.append(scores[f"{key}/cb{len(values)}"])
    return values


def uses_input(scores: dict[str, float], task: str, min_gain: float) -> bool:
    """Whether `task`'s gain reaches `min_gain` x its loss_ignoring, in the total or in any codebook."""
    gains = [scores[f"{task}/gain"], *per_codebook(scores, f"{task}/gain")]
    ignoring = [scores[f"{task}/loss_ignoring"], *per_codebook(scores, f"{task}/loss_ignoring")]
    return any(gain >= min_gain * base for gain, base in zip(gains, ignoring, strict=True))


class ConditioningCallback(L.Callback):
    """Logs `conditioning_scores` (`val/<task>/...`) after each validation on a validation `LayoutSource`, and
    warns when a task's gain stays below `min_gain` x loss_ignoring for `patience` validations."""

    def __init__(self, num_items: int = 16, min_gain: float = 0.02, patience: int = 2) -> None:
        if num_items < 2 or patience < 1 or min_gain < 0:
            raise ValueError(f"ConditioningCallback(num_items={num_items}, patience={patience}, "
                             f"min_gain={min_gain}): need num_items >= 2, patience >= 1, min_gain >= 0")
        self.num_items, self.min_gain, self.patience = num_items, min_gain, patience
        self.flat_for: dict[str, int] = {}  # task -> validations in a row with gain under min_gain
        self._samples: list[Sample] | None = None

    def _held_out(self, trainer: L.Trainer) -> LayoutSource | None:
        source = getattr(trainer.datamodule, "val_source", None) if trainer.datamodule is not None else None
        why = None
        if getattr(trainer.strategy, "sp_process_group", None) is not None:
            why = "sequence parallelism splits each pack over ranks"
        elif source is not None and not (isinstance(source, LayoutSource) and source.eval_t is not None):
            why = f"the validation source is a {type(source).__name__}, not a validation LayoutSource"
        if why is None:
            return source
        if self._samples is None:
            log.info("conditioning check off: %s", why)
            self._samples = []
        return None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        source = self._held_out(trainer)
        if source is None:
            return
        if self._samples is None:  # read once: up to 8 x num_items samples, evenly spaced over the split
            stride = max(1, len(source) // (8 * self.num_items))
            self._samples = [source.dataset[i] for i in range(0, len(source), stride)]
        config = pl_module.model_config
        was_training = pl_module.training
        pl_module.eval()  # no router noise, no expert-bias counts from these forwards
        scores = conditioning_scores(pl_module.model, pl_module.objective, self._samples, source.dataset.tokens,
                                     config.num_codebooks, source.noise, source.seed, source.eval_t,
                                     self.num_items, trainer.datamodule.config.seq_len)
        pl_module.train(was_training)
        pl_module.log_dict({f"val/{k}": v for k, v in scores.items()}, on_step=False, on_epoch=True,
                           batch_size=1)
        step = trainer.global_step
        for task in sorted({k.split("/")[0] for k in scores}):
            line = f"step {step}: {task} held-out loss {scores[f'{task}/loss']:.4f} acc {scores[f'{task}/acc']:.3f}"
            if f"{task}/gain" not in scores:
                log.info("%s", line)
                continue
            ignoring = scores[f"{task}/loss_ignoring"]
            codebooks = " ".join(f"{gain:.4f}" for gain in per_codebook(scores, f"{task}/gain"))
            log.info("%s | %s: loss %.4f acc %.3f | gain %.4f%s", line, INPUT_OF[task], ignoring,
                     scores[f"{task}/acc_ignoring"], scores[f"{task}/gain"],
                     f" (per codebook {codebooks})" if codebooks else "")
            flat = not uses_input(scores, task, self.min_gain)
            self.flat_for[task] = self.flat_for.get(task, 0) + 1 if flat else 0
            if self.flat_for[task] >= self.patience:
                log.warning("step %d: the model ignores its input on %s: held-out loss %.4f vs %.4f with the %s "
                            "(gain under %.0f%%, in total and per codebook, for %d validations in a row); see README \"Your own data\"",
                            step, task, scores[f"{task}/loss"], ignoring, INPUT_OF[task], 100 * self.min_gain,
                            self.flat_for[task])
