"""`full`: the official full rules R1-R8 (contract 4.3), in force when a pack uses block ids."""

from __future__ import annotations

import torch

from lumina.attention.rules import (
    IMAGE_ANSWER,
    RULES,
    TEXT_ANSWER,
    TEXT_PROMPT,
    AttentionRule,
    Rows,
    any_in_group,
    turn_groups,
)


@RULES.register("full", official=True)
class FullRules(AttentionRule):
    """R1-R8. A clean row attends only clean rows: clean answer text its own and earlier blocks of its turn
    (R7), clean prompt and media rows no answer text of their turn (R8). So every clean row is final, and so
    is a noisy non-answer row (BOA, the image answer's markers) unless its turn holds a noisy image (R6)."""

    def allow(self, q: Rows, k: Rows) -> torch.Tensor:
        cq, ck, tq, tk, bq, bk, yq, yk = q.is_clean, k.is_clean, q.turn, k.turn, q.block, k.block, q.type, k.type
        nq, nk = ~cq, ~ck
        same, prev = tk == tq, tk < tq
        q_text, q_image = yq == TEXT_ANSWER, yq == IMAGE_ANSWER
        k_text, k_prompt = yk == TEXT_ANSWER, yk == TEXT_PROMPT
        r1 = nq & q_text & nk & same & ((k_text & (bk == bq)) | (k_prompt & (bk <= bq)))
        r2 = nq & q_text & ck & prev
        r3 = nq & q_text & ck & same & k_text & (bk < bq)
        r4 = nq & q_image & nk & same
        r5 = nq & q_image & ck & prev
        r6 = nq & ~q_text & ~q_image & ((nk & same & ~k_text) | (ck & prev))
        r7 = cq & q_text & ck & (prev | (same & (k_prompt | k_text) & (bk <= bq)))
        r8 = cq & ~q_text & ck & (prev | (same & ~k_text))
        return r1 | r2 | r3 | r4 | r5 | r6 | r7 | r8

    def final_rows(self, rows: Rows, segment: torch.Tensor) -> torch.Tensor:
        answer = (rows.type == TEXT_ANSWER) | (rows.type == IMAGE_ANSWER)
        noisy_image = ~rows.is_clean & (rows.type == IMAGE_ANSWER)
        noisy_other = ~rows.is_clean & ~answer & ~any_in_group(noisy_image, turn_groups(rows, segment))
        return rows.is_clean | noisy_other
