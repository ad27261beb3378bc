"""Gradient accumulation averages the micro-batch losses: the gradient of one optimizer step over 2 micro-batches
equals the gradient of (loss_1 + loss_2) / 2 computed by hand on the same two batches and initial weights."""

from __future__ import annotations

import copy

import lightning as L
import torch
from train_helpers import compose_train, quiet, small_data

from lumina.model import LuminaModel
from lumina.objective import LuminaObjective
from lumina.training import build


class Capture(L.Callback):
    """The initial weights, the micro-batches of the first optimizer step and that step's gradients."""

    def __init__(self) -> None:
        self.batches: list = []
        self.grads: dict[str, torch.Tensor] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.initial = copy.deepcopy(pl_module.model.state_dict())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.grads is None:
            self.batches.append(copy.deepcopy(batch))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}


def test_two_micro_batches_give_the_gradient_of_their_mean_loss(tmp_path):
    cfg = compose_train(["experiment=debug", *quiet(tmp_path), *small_data(), "trainer.max_steps=1",
                         "trainer.accumulate_grad_batches=2", "trainer.limit_val_batches=0",
                         "objective.balance.selection_noise=0"])  # the hand replay below routes without noise
    module = build.module(cfg)
    capture = Capture()
    trainer = build.trainer(cfg, [capture], [])
    trainer.fit(module, datamodule=build.datamodule(cfg, module.model_config))
    assert len(capture.batches) == 2 and capture.grads

    reference = LuminaModel(module.model_config)
    reference.load_state_dict(capture.initial)
    objective = LuminaObjective(module.objective.config)
    losses = [objective(reference(batch), batch).loss for batch in capture.batches]
    assert abs(losses[0].item() - losses[1].item()) > 1e-6  # distinct micro-batches
    ((losses[0] + losses[1]) / 2).backward()
    want = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert want.keys() == capture.grads.keys()
    for name, grad in want.items():
        torch.testing.assert_close(capture.grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
