"""The block-diffusion attention rule (contract section 4.3) and its dense reference `allowed_mask`.

`rules_allow` is written element-wise on broadcastable tensors, so one statement of the rule serves the
dense mask ([S, 1] against [1, S]), per-segment slices and flex-attention's `mask_mod` (scalars).
"""

from __future__ import annotations

import torch

from lumina.attention.bounds import resolve_seg_bounds
from lumina.data.roles import TokenType

# plain ints: the rule is also traced into flex-attention's compiled mask_mod
TEXT_PROMPT, TEXT_ANSWER, IMAGE_ANSWER = (int(t) for t in (TokenType.TEXT, TokenType.TEXT_ANSWER, TokenType.IMAGE_ANSWER))


def simple_rules(cq: torch.Tensor, ck: torch.Tensor, tq: torch.Tensor, tk: torch.Tensor) -> torch.Tensor:
    """Rules S1-S3. cq/ck: is_clean (bool) of query/key, tq/tk: turn ids; all broadcastable."""
    nq, nk = ~cq, ~ck
    same, prev = tk == tq, tk < tq
    return (nq & nk & same) | (nq & ck & prev) | (cq & ck & (tk <= tq))


def full_rules(
    cq: torch.Tensor, ck: torch.Tensor, tq: torch.Tensor, tk: torch.Tensor,
    bq: torch.Tensor, bk: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor,
) -> torch.Tensor:
    """Rules R1-R8. c: is_clean (bool), t: turn, b: block, y: type id; q = query, k = key; broadcastable."""
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


def rules_allow(
    full: bool, cq: torch.Tensor, ck: torch.Tensor, tq: torch.Tensor, tk: torch.Tensor,
    bq: torch.Tensor, bk: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor,
) -> torch.Tensor:
    """The full rules when `full` (block ids in use), else the simple rules."""
    if full:
        return full_rules(cq, ck, tq, tk, bq, bk, yq, yk)
    return simple_rules(cq, ck, tq, tk)


def segment_ids(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[S] int64 segment index of every position; tail positions (>= cu_seqlens[-1]) get n (no segment)."""
    positions = torch.arange(seq_len, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)


def _row(name: str, t: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[1] != seq_len or t.shape[0] not in (1, batch):
        raise ValueError(f"{name} has shape {list(t.shape)}; expected [S] or [B, S] with B={batch}, S={seq_len}")
    return t


def _as_flag(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"{name} has dtype {t.dtype}; expected bool or 0/1 integers")
    bad = (t != 0) & (t != 1)
    if bad.any():
        raise ValueError(f"{name} must be 0/1, found values {t[bad].unique()[:6].tolist()}")
    return t != 0


def _as_ids(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} has dtype {t.dtype}; expected an integer tensor")
    return t.long()


def allowed_mask(
    token_valid: torch.Tensor,
    cu_seqlens: torch.Tensor,
    type_ids: torch.Tensor | None = None,
    turn_ids: torch.Tensor | None = None,
    is_clean: torch.Tensor | None = None,
    block_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference rule as a dense [B, S, S] bool tensor, True where query (dim 1) may attend key (dim 2).

    allowed = same segment & valid(q) & valid(k) & (rules, when turn_ids or is_clean is given; a missing one
    is all zeros). The full rules apply when block_ids has any value >= 0, else the simple rules. A missing
    type_ids is all 1 (the official default). Positions at or after cu_seqlens[-1] (tail padding) take the
    last segment's id, as in the official mask: with token_valid false there (the only tail `build_spec`
    accepts) they attend nothing and nothing attends them. O(S^2) memory: for tests and reference use.
    """
    token_valid = _as_flag("token_valid", token_valid.unsqueeze(0) if token_valid.dim() == 1 else token_valid)
    if token_valid.dim() != 2:
        raise ValueError(f"token_valid has shape {list(token_valid.shape)}; expected [S] or [B, S]")
    batch, seq_len = token_valid.shape
    cu_seqlens = torch.as_tensor(cu_seqlens)
    bounds = resolve_seg_bounds(cu_seqlens, seq_len)
    if bounds is None:
        raise ValueError(f"cu_seqlens must hold at least 2 entries, got {cu_seqlens.tolist()}")
    last = len(bounds) - 2  # the tail joins the last segment (official)
    seg = segment_ids(cu_seqlens.to(token_valid.device), seq_len).clamp_max(last)
    allowed = (seg[:, None] == seg[None, :]).unsqueeze(0) & token_valid[:, :, None] & token_valid[:, None, :]
    if turn_ids is None and is_clean is None:
        return allowed
    zeros = torch.zeros(1, seq_len, dtype=torch.long, device=token_valid.device)
    turn = zeros if turn_ids is None else _as_ids("turn_ids", _row("turn_ids", turn_ids, batch, seq_len))
    clean = zeros.bool() if is_clean is None else _as_flag("is_clean", _row("is_clean", is_clean, batch, seq_len))
    types = zeros + 1 if type_ids is None else _as_ids("type_ids", _row("type_ids", type_ids, batch, seq_len))
    if block_ids is not None:
        block_ids = _as_ids("block_ids", _row("block_ids", block_ids, batch, seq_len))
    full = block_ids is not None and bool((block_ids >= 0).any())
    blocks = block_ids if block_ids is not None else zeros
    rules = rules_allow(
        full,
        clean[:, :, None], clean[:, None, :], turn[:, :, None], turn[:, None, :],
        blocks[:, :, None], blocks[:, None, :], types[:, :, None], types[:, None, :],
    )
    return allowed & rules
