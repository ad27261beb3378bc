"""`LuminaObjective`: LuminaOutput + PackedBatch -> the training loss `ObjectiveConfig` states.

Each N is summed over the data-parallel ranks (one all_reduce) and each rank's loss is
sum_local / N_global * world_size, so the ranks' mean that gradient averaging takes is the global-token mean.
Targets are gathered at the output's `text_rows` / `image_rows`; both head terms always join the loss (an
empty row set gives an exact 0 in the graph), so every conditional module's backward runs on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lumina.contract.batch import PackedBatch, segment_ids
from lumina.contract.roles import TokenType
from lumina.model.output import LuminaOutput
from lumina.model.routers import MoERouter
from lumina.objective.balance import ProbsFn, balance_loss, expert_load, softmax_probs
from lumina.objective.expert_bias import ExpertBiasUpdater, find_expert_biases
from lumina.objective.labels import check_inverse_t_rows, gather_targets
from lumina.objective.objective_config import ObjectiveConfig
from lumina.objective.reduce import dp_sum, dp_world_size
from lumina.objective.result import ObjectiveResult
from lumina.schedules import DEFAULT_SCHEDULE, MaskingSchedule, build_schedule


class LuminaObjective(nn.Module):
    """Stateless apart from the expert-bias counts accumulated in training mode. group: the ranks that average
    gradients (None = the default group); sequence_group: the ranks sharing this rank's pack (sequence
    parallelism; only the balance loss's statistics are per pack); schedule: the masking schedule the batches
    were noised with (None = the official one), whose ELBO weight w(t) the "inverse_t" weighting uses."""

    def __init__(self, config: ObjectiveConfig | None = None, group: dist.ProcessGroup | None = None,
                 sequence_group: dist.ProcessGroup | None = None, schedule: MaskingSchedule | None = None) -> None:
        super().__init__()
        self.config = config or ObjectiveConfig()
        self.schedule = schedule or build_schedule(DEFAULT_SCHEDULE)
        self.bias_updater = ExpertBiasUpdater(self.config.balance.bias_rate, group)
        self.sequence_group = sequence_group
        self.router_probs: ProbsFn | None = None  # the routers' `balance_probs`, given by `configure_routers`

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The data-parallel group of both the token counts and the expert-bias counts."""
        return self.bias_updater.group

    @group.setter
    def group(self, group: dist.ProcessGroup | None) -> None:
        self.bias_updater.group = group

    def forward(self, output: LuminaOutput, batch: PackedBatch) -> ObjectiveResult:
        cfg = self.config
        if batch.labels is None:
            raise ValueError("batch.labels is None; the objective needs labels")
        inverse_t = cfg.text_weighting == "inverse_t"
        if cfg.validate and inverse_t:
            check_inverse_t_rows(output.text_rows, batch.noise_t, batch.answer_mask)
        targets = gather_targets(batch.labels, output.text_rows, output.image_rows)
        text_rows = output.text_rows.long()
        device = targets.text.device

        num_text = ((batch.answer_mask & (batch.type_ids == TokenType.TEXT_ANSWER)).sum() if inverse_t
                    else torch.tensor(text_rows.numel(), device=device))
        num_image = torch.tensor(output.image_rows.numel(), device=device)
        local = torch.stack([num_text.to(torch.int64), num_image.to(torch.int64)])
        num_text_global, num_image_global = dp_sum(local, self.group).unbind()
        world = dp_world_size(self.group)
        text_scale = (world / num_text_global.clamp(min=1).double()).float()
        image_scale = (world / num_image_global.clamp(min=1).double()).float()

        # per-row weights of the fused head losses: the schedule's ELBO weight and the global-token normalisation
        text_weight = text_scale.expand(text_rows.numel())
        if inverse_t:
            text_weight = self.schedule.scale_text_loss(text_weight, batch.noise_t.reshape(-1)[text_rows].float())
        num_codebooks = targets.image.shape[1]
        heads = output.heads
        text = heads.text_loss(output.text_states, targets.text, text_weight)  # sum(w(t) CE) / N_txt * world
        image = heads.image_loss(output.image_states, targets.image,
                                 (image_scale / num_codebooks).expand(targets.image.shape[0]))
        text_loss, image_loss = text.total, image.total

        num_experts = output.router_logits[0].shape[-1] if output.router_logits else 0
        load = expert_load(output.router_topk_ids, batch.token_valid, num_experts)
        if cfg.balance.aux_coef > 0:
            segments = {}
            if cfg.balance.aux_scope == "sequence":
                rows = segment_ids(batch.cu_seqlens, batch.pack_len)  # a window's rows index its pack's segments
                start = batch.window_start
                segments = dict(segment_ids=rows[start:start + batch.seq_len].unsqueeze(0),
                                num_segments=batch.cu_seqlens.numel() - 1)
            aux = cfg.balance.aux_coef * balance_loss(output.router_logits, output.router_topk_ids,
                                                       batch.token_valid, self._balance_probs(),
                                                       group=self.sequence_group, **segments)
        else:
            aux = torch.zeros((), device=text_loss.device)
        if cfg.balance.bias_update and self.training:
            self.bias_updater.accumulate(load)

        loss = cfg.text_weight * text_loss + cfg.image_weight * image_loss + aux
        per_codebook = image.per_row.sum(dim=0) * image_scale
        return ObjectiveResult(
            loss=loss, text_loss=text_loss.detach(), image_loss=image_loss.detach(),
            image_loss_per_codebook=per_codebook, balance_loss=aux.detach(),
            num_text_local=local[0], num_text_global=num_text_global,
            num_image_local=local[1], num_image_global=num_image_global,
            text_preds=text.preds, text_targets=targets.text, image_preds=image.preds, image_targets=targets.image,
            expert_load=load)

    def configure_routers(self, model: nn.Module) -> int:
        """Give `model`'s routers this objective's selection noise, take their `balance_probs` for the balance
        loss and, with `balance.bias_update`, check each has an expert bias. Returns how many routers."""
        routers = [module for module in model.modules() if isinstance(module, MoERouter)]
        kinds = {type(router) for router in routers}
        if len(kinds) > 1:
            raise ValueError(f"the model mixes routers {sorted(k.__name__ for k in kinds)}; the balance loss "
                             "takes one router's balance_probs")
        for router in routers:
            router.set_selection_noise(self.config.balance.selection_noise)
        if self.config.balance.bias_update:
            find_expert_biases(model)  # raises naming a router without an expert bias
        self.router_probs = routers[0].balance_probs if routers else None
        return len(routers)

    def _balance_probs(self) -> ProbsFn:
        """The balance loss's per-token probabilities: softmax, or the configured routers' own."""
        if self.config.balance.p_source == "softmax":
            return softmax_probs
        if self.router_probs is None:
            raise ValueError("objective.balance.p_source='router' takes the routers' balance_probs: call "
                             "LuminaObjective.configure_routers(model) before the balance loss (aux_coef > 0)")
        return self.router_probs

    @torch.no_grad()
    def on_optimizer_step(self, model: nn.Module) -> torch.Tensor | None:
        """Apply the accumulated expert-bias update to `model`'s routers (call once per optimizer step, after
        gradient accumulation, on every rank). Returns the update [L, E], or None when off / nothing pending."""
        if not self.config.balance.bias_update:
            return None
        self.bias_updater.rate = self.config.balance.bias_rate
        return self.bias_updater.apply(find_expert_biases(model))
