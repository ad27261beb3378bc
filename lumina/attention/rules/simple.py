"""`simple`: the official simple rules S1-S3 (contract 4.3), in force when a pack uses no block ids."""

from __future__ import annotations

import torch

from lumina.attention.rules import RULES, AttentionRule, Rows, any_in_group, noisy_answer, turn_groups


@RULES.register("simple", official=True)
class SimpleRules(AttentionRule):
    """S1-S3. A clean row attends every clean row of its own and earlier turns (S3), so the rows of a
    segment's last turn, where answer rows are appended, are never final; in earlier turns a clean row is
    final, and a noisy one unless its turn holds a noisy answer row (S1)."""

    def allow(self, q: Rows, k: Rows) -> torch.Tensor:
        cq, ck, tq, tk = q.is_clean, k.is_clean, q.turn, k.turn
        nq, nk = ~cq, ~ck
        same, prev = tk == tq, tk < tq
        return (nq & nk & same) | (nq & ck & prev) | (cq & ck & (tk <= tq))

    def final_rows(self, rows: Rows, segment: torch.Tensor) -> torch.Tensor:
        segment = segment.long()
        last = torch.full((int(segment.max()) + 1 if segment.numel() else 0,), torch.iinfo(torch.long).min,
                          dtype=torch.long, device=segment.device)
        last = last.scatter_reduce(0, segment, rows.turn.long(), "amax")[segment]
        earlier = rows.turn < last
        quiet_turn = ~any_in_group(noisy_answer(rows), turn_groups(rows, segment))
        return earlier & (rows.is_clean | quiet_turn)
