"""`LuminaObjective`: LuminaOutput + PackedBatch -> the global-token-normalised training loss.

    L = text_weight * sum(w(t) CE_text) / N_txt + image_weight * sum_cells(mean_c CE_c) / N_img + balance

Each N is summed over the data-parallel ranks with one all_reduce; each rank's loss is
sum_local / N_global * world_size, so the mean over ranks that DDP/FSDP gradient averaging takes equals
the gradient of the global-token mean. The objective never re-selects rows: targets are gathered at the
output's `text_rows` / `image_rows`, and both head terms always join the loss (an empty row set gives an
exact 0 connected to the graph), so every conditional module's backward runs on every rank.
Gradient accumulation averages the micro-batch losses (Lightning divides each by accumulate_grad_batches).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from lumina.data.batch import PackedBatch
from lumina.objective.balance import balance_loss, expert_load
from lumina.objective.config import ObjectiveConfig
from lumina.objective.expert_bias import ExpertBiasUpdater, find_expert_biases
from lumina.objective.labels import TEXT_ANSWER_TYPE, gather_targets, normalize_labels, validate_supervision
from lumina.objective.reduce import dp_sum, dp_world_size
from lumina.objective.result import ObjectiveResult
from lumina.objective.token_losses import image_ce, text_ce


class ModelOutput(Protocol):
    """The fields of `lumina.model.LuminaOutput` the objective reads."""

    text_logits: torch.Tensor  # [Nt, V]
    text_rows: torch.Tensor  # [Nt] flat b*S+s
    image_logits: torch.Tensor  # [Ni, C, K]
    image_rows: torch.Tensor  # [Ni]
    router_logits: list[torch.Tensor]  # per MoE layer [B, S, E]
    router_topk_ids: list[torch.Tensor]  # per MoE layer [B, S, k]


class LuminaObjective(nn.Module):
    """Stateless apart from the expert-bias counts accumulated in training mode (`self.training`).

    group: the process group whose ranks average gradients (None = the default group).
    """

    def __init__(self, config: ObjectiveConfig | None = None, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.config = config or ObjectiveConfig()
        self.bias_updater = ExpertBiasUpdater(self.config.balance.bias_rate, group)
        self.group = group

    @property
    def group(self) -> dist.ProcessGroup | None:
        return self._group

    @group.setter
    def group(self, group: dist.ProcessGroup | None) -> None:
        """Set the data-parallel group of both the token counts and the expert-bias counts."""
        self._group = group
        self.bias_updater.group = group

    def forward(self, output: ModelOutput, batch: PackedBatch) -> ObjectiveResult:
        cfg = self.config
        if batch.labels is None:
            raise ValueError("batch.labels is None; the objective needs labels")
        labels = normalize_labels(batch.labels, batch.input_ids)
        inverse_t = cfg.text_weighting == "inverse_t"
        if cfg.validate:
            validate_supervision(
                labels, batch.type_ids, batch.token_valid, output.text_rows, output.image_rows,
                vocab_size=output.text_logits.shape[-1], codebook_size=output.image_logits.shape[-1],
                noise_t=batch.noise_t if inverse_t else None, answer_mask=batch.answer_mask if inverse_t else None)
        targets = gather_targets(labels, output.text_rows, output.image_rows)

        text_tok = text_ce(output.text_logits, targets.text)  # [Nt]
        if inverse_t:
            text_tok = text_tok / batch.noise_t.reshape(-1)[output.text_rows.long()].float()
            num_text = (batch.answer_mask & (batch.type_ids == TEXT_ANSWER_TYPE)).sum()
        else:
            num_text = torch.tensor(output.text_rows.numel(), device=text_tok.device)
        image_cell = image_ce(output.image_logits, targets.image)  # [Ni, C]
        num_image = torch.tensor(output.image_rows.numel(), device=image_cell.device)

        local = torch.stack([num_text.to(torch.int64), num_image.to(torch.int64)])
        num_text_global, num_image_global = dp_sum(local, self.group).unbind()
        world = dp_world_size(self.group)
        text_scale = world / num_text_global.clamp(min=1).double()
        image_scale = world / num_image_global.clamp(min=1).double()
        text_loss = text_tok.sum() * text_scale.float()
        image_loss = image_cell.mean(dim=-1).sum() * image_scale.float()

        load = expert_load(output.router_topk_ids, batch.token_valid, _num_experts(output))
        if cfg.balance.aux_coef > 0:
            aux = cfg.balance.aux_coef * balance_loss(output.router_logits, output.router_topk_ids,
                                                       batch.token_valid, cfg.balance.p_source)
        else:
            aux = torch.zeros((), device=text_loss.device)
        if cfg.balance.bias_update and self.training:
            self.bias_updater.accumulate(load)

        loss = cfg.text_weight * text_loss + cfg.image_weight * image_loss + aux
        with torch.no_grad():
            per_codebook = image_cell.sum(dim=0) * image_scale.float()
            text_preds = output.text_logits.argmax(dim=-1)
            image_preds = output.image_logits.argmax(dim=-1)
        return ObjectiveResult(
            loss=loss, text_loss=text_loss.detach(), image_loss=image_loss.detach(),
            image_loss_per_codebook=per_codebook, balance_loss=aux.detach(),
            num_text_local=local[0], num_text_global=num_text_global,
            num_image_local=local[1], num_image_global=num_image_global,
            text_preds=text_preds, text_targets=targets.text, image_preds=image_preds, image_targets=targets.image,
            expert_load=load)

    @torch.no_grad()
    def on_optimizer_step(self, model: nn.Module) -> torch.Tensor | None:
        """Apply the accumulated expert-bias update to `model`'s routers (call once per optimizer step, after
        gradient accumulation, on every rank). Returns the update [L, E], or None when off / nothing pending."""
        if not self.config.balance.bias_update:
            return None
        self.bias_updater.rate = self.config.balance.bias_rate
        return self.bias_updater.apply(find_expert_biases(model))


def _num_experts(output: ModelOutput) -> int:
    if output.router_logits:
        return output.router_logits[0].shape[-1]
    return 0
