"""`PostTraining`: one optimizer step of RL / preference optimisation inside the LightningModule's training
step (`LuminaModule` calls `step` instead of the supervised objective when `objective.post_training` is set).

Per rollout cycle (every `inner_epochs` optimizer steps): roll out G completions per prompt with the current
weights, score them with the rewards and, with inner_epochs > 1, the old policy's likelihoods on each inner
epoch's views. Only the completions the loss term reads are scored (`LossTerm.reads`: GRPO without KL skips
zero-variance groups, self-distillation the rejected samples); the others' estimates are 0. Per step: the
policy's likelihood estimates on this epoch's views (gradients), the reference's on the same views when the
loss term reads them, and the loss term. Views are seeded by (seed, cycle, epoch):
a step's masks depend on nothing else. A resume continues exactly from a cycle boundary, the only place a
checkpoint can resume without the cycle's rollout: with inner_epochs > 1 a step interval that is not a
multiple of it, or a time interval, is refused (`check_checkpoint_interval`), and a checkpoint saved inside a
cycle otherwise (a preemption handler's) rolls that cycle out again with the resumed weights, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lumina.contract.tasks import TASKS
from lumina.data.noise import stable_seed
from lumina.model.activation_checkpointing import RoutingTape
from lumina.objective.reduce import dp_sum
from lumina.post_training.estimators import MODALITIES, LikelihoodEstimator, build_estimator
from lumina.post_training.losses import LossInputs, LossTerm, build_loss_term, global_ratio
from lumina.post_training.prompts import PromptBatch
from lumina.post_training.rewards import Rewards
from lumina.post_training.rollout import RolloutConfig, rollout
from lumina.post_training.routing_replay import ROUTING_MODES, RoutingReplay
from lumina.post_training.samples import Completion
from lumina.post_training.scoring import score_views

PASS_REWARD = 1.0  # a completion "passes" (pass@G) when its reward reaches this


@dataclass
class PostTrainingConfig:
    """term: the loss term ({name, options}, `lumina.post_training.losses`); estimators: modality -> estimator
    ({name, options} or a name); inner_epochs: optimizer steps per rollout (> 1: PPO-style ratios to the
    rollout's policy); pack_tokens: rows per scoring forward; seed: of the views' masks; routing: none |
    compare (log `routing_divergence`, the share of the update's top-k slots the rollout policy's routing on the
    same views did not pick) | replay (R3: also route the update by the rollout policy's ids); both cost one
    no-grad scoring pass per inner epoch (shared with the old-policy pass when inner_epochs > 1)."""

    term: dict[str, Any] | str = "grpo"
    estimators: dict[str, Any] = field(default_factory=lambda: {"text": "coupled", "image": "trajectory"})
    inner_epochs: int = 1
    pack_tokens: int = 8192
    seed: int = 0
    routing: str = "none"

    def __post_init__(self) -> None:
        for name in ("inner_epochs", "pack_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"objective.post_training.{name}={value!r}: must be an integer >= 1")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"objective.post_training.routing={self.routing!r}: must be one of {ROUTING_MODES}")
        unknown = sorted(set(self.estimators) - set(MODALITIES))
        if unknown:
            raise ValueError(f"objective.post_training.estimators.{unknown[0]}: not a modality {MODALITIES}")

    def check_checkpoint_interval(self, every_n_train_steps: int | None, train_time_interval: Any,
                                  field_name: str) -> None:
        """A periodic checkpoint must fall between rollout cycles (its rollout is not saved): with
        inner_epochs > 1, a step interval that is a multiple of it and no time interval. ValueError names the
        field (`field_name`: the checkpoint callback's config path)."""
        k = self.inner_epochs
        if k > 1 and every_n_train_steps and every_n_train_steps % k:
            raise ValueError(f"{field_name}.every_n_train_steps={every_n_train_steps}: not a multiple of "
                             f"objective.post_training.inner_epochs={k}; a checkpoint inside a rollout cycle "
                             f"cannot resume exactly (set a multiple of {k})")
        if k > 1 and train_time_interval is not None:
            raise ValueError(f"{field_name}.train_time_interval={train_time_interval!r}: with "
                             f"objective.post_training.inner_epochs={k} a timed checkpoint can fall inside a "
                             f"rollout cycle, which cannot resume exactly; use every_n_train_steps, a multiple "
                             f"of {k}")

    def resumes_exactly_at(self, step: int) -> bool:
        """Whether a checkpoint after `step` optimizer steps starts a new rollout cycle."""
        return step % self.inner_epochs == 0


@dataclass
class _Cycle:
    """One rollout and what every inner epoch of it reuses."""

    cycle: int
    completions: list[Completion]
    rewards: torch.Tensor
    reads: torch.Tensor  # bool [N]: the completions the loss term reads, the only ones scored
    old: dict[int, torch.Tensor] = field(default_factory=dict)  # epoch -> old policy's estimates
    tapes: dict[int, RoutingTape] = field(default_factory=dict)  # epoch -> the old policy's routing (R3)


class PostTraining:
    def __init__(self, config: PostTrainingConfig, rollout_config: RolloutConfig, rewards: Rewards) -> None:
        self.config = config
        self.rollout_config = rollout_config
        self.rewards = rewards
        self.term: LossTerm = build_loss_term(config.term, "objective.post_training.term")
        self.estimators: dict[str, LikelihoodEstimator] = {}
        for modality, spec in config.estimators.items():
            estimator = build_estimator(spec, f"objective.post_training.estimators.{modality}")
            if estimator.modality != modality:
                raise ValueError(f"objective.post_training.estimators.{modality}={spec!r}: scores "
                                 f"{estimator.modality} answers")
            self.estimators[modality] = estimator
        self._cycles: dict[int, _Cycle] = {}  # micro-batch -> its current rollout

    def needs_reference(self) -> bool:
        return self.term.needs_reference()

    def step(self, model: nn.Module, reference: AbstractContextManager[nn.Module] | None, batch: PromptBatch,
             step: int, micro: int = 0,
             group: dist.ProcessGroup | None = None,
             on_output: Callable[[Any, Any], None] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss (this rank's share) and metrics of micro-batch `micro` of optimizer step `step` on `batch`'s
        prompts (rolled out at a cycle's first step; its later inner epochs reuse that rollout). `reference`:
        a context yielding the reference model, entered once to score it (the loss term reads it)."""
        cycle, epoch = divmod(step, self.config.inner_epochs)
        current = self._cycles.get(micro)
        if current is None or current.cycle != cycle:
            current = self._cycles[micro] = self._roll_out(model, batch, cycle)
            self._score_old_policy(model, current, batch, epoch)
        completions = current.completions
        score = self._scorer(current, batch, epoch)
        routing = None
        if self.config.routing == "none":
            logp = score(model, on_output)
        else:
            with RoutingReplay(model).replaying(current.tapes[epoch], self.config.routing == "replay") as routing:
                logp = score(model, on_output)
        ref = None
        if self.needs_reference():
            if reference is None:
                raise ValueError("the loss term reads a reference model and none was given")
            with torch.no_grad(), reference as reference_model:
                ref = score(reference_model, None)
        device = logp.device
        inputs = LossInputs(
            logp=logp, rewards=current.rewards.to(device),
            groups=torch.tensor([c.group for c in completions], device=device),
            num_tokens=torch.tensor([float(c.num_tokens) for c in completions], device=device),
            old_logp=current.old.get(epoch), ref_logp=ref, group=group)
        out = self.term(inputs)
        metrics = dict(out.metrics)
        metrics.update(rollout_metrics(completions, current.rewards, batch.tasks, device, group))
        if routing is not None:
            metrics["routing_divergence"] = routing.share(group).to(device)
        return out.loss, metrics

    def _score_old_policy(self, model: nn.Module, current: _Cycle, batch: PromptBatch, epoch: int) -> None:
        """The rollout's own policy on every remaining inner epoch's views: its estimates (inner_epochs > 1)
        and its routing (`routing` != none)."""
        keep_old, keep_routing = self.config.inner_epochs > 1, self.config.routing != "none"
        if not (keep_old or keep_routing):
            return
        with torch.no_grad():
            for e in range(epoch, self.config.inner_epochs):
                score = self._scorer(current, batch, e)
                if keep_routing:
                    with RoutingReplay(model).recording() as current.tapes[e]:
                        old = score(model, None)
                else:
                    old = score(model, None)
                if keep_old:
                    current.old[e] = old

    def _roll_out(self, model: nn.Module, batch: PromptBatch, cycle: int) -> _Cycle:
        completions = rollout(model, batch.prompts, self.rollout_config, batch.tokens, cycle)
        for c in completions:
            c.reward = self.rewards(c.prompt, c)
        rewards = torch.tensor([c.reward for c in completions], dtype=torch.float32)
        reads = self.term.reads(rewards, torch.tensor([c.group for c in completions]))
        return _Cycle(cycle, completions, rewards, reads)

    def _scorer(self, current: _Cycle, batch: PromptBatch, epoch: int):
        """model -> [N] estimates on this (cycle, epoch)'s views of the completions the term reads (0 for the
        rest): each completion's views drawn by its modality's estimator from its own stream (seed, cycle,
        epoch, completion key), so a completion's masks do not depend on which others share its rank or batch."""
        completions, cycle = current.completions, current.cycle
        views = []
        for i, c in enumerate(completions):
            if not current.reads[i]:
                continue
            modality = "image" if c.is_image else "text"
            estimator = self.estimators.get(modality)
            if estimator is None:
                raise ValueError(f"objective.post_training.estimators.{modality}: no estimator for the "
                                 f"{modality} answers of task {c.prompt.task!r}")
            generator = torch.Generator().manual_seed(stable_seed(self.config.seed, "views", cycle, epoch, c.key))
            for view in estimator.plan([c], generator):
                view.sample = i
                views.append(view)

        def score(model: nn.Module, on_output: Callable | None) -> torch.Tensor:
            return score_views(model, completions, views, batch.tokens, self.rollout_config.temperature,
                               self.config.pack_tokens, on_output)

        return score


def rollout_metrics(completions: list[Completion], rewards: torch.Tensor, tasks: tuple[str, ...],
                    device: torch.device, group: dist.ProcessGroup | None) -> dict[str, torch.Tensor]:
    """Per task, global over the ranks: reward mean, reward spread (mean within-group std), pass@G (share of
    groups with a completion whose reward reaches PASS_REWARD); text tasks: generated length (answer tokens).
    A task no rank rolled out this step logs nothing (not a 0 that would read as a failure)."""
    metrics = {}
    for task in tasks:
        members = [i for i, c in enumerate(completions) if c.prompt.task == task]
        if float(dp_sum(torch.tensor([float(len(members))], dtype=torch.float64, device=device), group)[0]) == 0:
            continue
        r = rewards[members].double()
        groups: dict[int, list[float]] = {}
        for i in members:
            groups.setdefault(completions[i].group, []).append(float(rewards[i]))
        spread = sum(torch.tensor(g, dtype=torch.float64).std(unbiased=False).item() for g in groups.values())
        passed = sum(max(g) >= PASS_REWARD for g in groups.values())
        metrics[f"{task}/reward"] = global_ratio(r.sum(), len(members), device, group)
        metrics[f"{task}/reward_spread"] = global_ratio(spread, len(groups), device, group)
        metrics[f"{task}/pass_at_g"] = global_ratio(passed, len(groups), device, group)
        row = TASKS.find(task)
        if row is None or not row.image_answer:
            length = sum(len(completions[i].answer_ids or []) for i in members)
            metrics[f"{task}/length"] = global_ratio(length, len(members), device, group)
    return metrics


def build_post_training(options: dict[str, Any], rollout_options: dict[str, Any] | None,
                        rewards: dict[str, Any] | None) -> PostTraining:
    """From plain configs: objective.post_training, rollout (less its `prompts`), and the instantiated
    reward mapping (task -> callable). A missing group or a bad field raises ValueError naming it."""
    if rollout_options is None:
        raise ValueError("rollout: objective.post_training needs a rollout group (e.g. rollout=world)")
    if not rewards:
        raise ValueError("reward: objective.post_training needs a reward group (e.g. reward=world)")
    fields = dict(rollout_options)
    fields.pop("prompts", None)
    try:
        config = PostTrainingConfig(**options)
        rollout_config = RolloutConfig(**fields)
    except TypeError as error:
        raise ValueError(f"objective.post_training / rollout: {error}") from None
    return PostTraining(config, rollout_config, Rewards(rewards))
