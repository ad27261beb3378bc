"""The block-diffusion attention rule as a part: the `AttentionRule` protocol, the `RULES` registry, and the
dense reference `allowed_mask`. Segments and token validity are applied around every rule by the attention
spec. The official rule sets (contract 4.3) are `full` (R1-R8) and `simple` (S1-S3); `attn_rule: auto`, the
default, is the official choice per pack: full when any block id is >= 0, else simple. A rule of the user's
own is named by its dotted path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lumina.attention.bounds import resolve_seg_bounds
from lumina.contract.batch import segment_ids
from lumina.contract.roles import TokenType
from lumina.parts import Registry

# plain ints: the rule is also traced into flex-attention's compiled mask_mod
TEXT_PROMPT, TEXT_ANSWER, IMAGE_ANSWER = (int(t) for t in (TokenType.TEXT, TokenType.TEXT_ANSWER, TokenType.IMAGE_ANSWER))
AUTO = "auto"
RULES = Registry("attention rule", "lumina.attention.rules", official_choices=(AUTO,))


class Rows(NamedTuple):
    """Per-row metadata of queries or keys; any broadcastable shapes. is_clean bool, the others int64."""

    is_clean: torch.Tensor
    turn: torch.Tensor
    block: torch.Tensor
    type: torch.Tensor


class AttentionRule:
    """Protocol of an attention rule (stateless; one instance per class is shared).
    `allow(q, k)` -> bool, broadcast of q's and k's shapes: query q may attend key k (same sequence). It is
    element-wise, so one statement serves the dense mask, per-segment slices and flex's `mask_mod`.
    `final_rows(rows, segment)` -> bool [S] (rows: `Rows` of [S], segment [S] ids): the rows whose keys and
    values never change while the samplers decode, so a key/value cache may hold them. Noisy answer rows
    (type 3 or 4, not clean) change; rows are appended only as text answers of a segment's last turn (in
    later blocks) or as later turns. A row is final when it is not a noisy answer row, attends only final
    rows, and attends no row that may be appended. The default reports none (a cache runs the full forward).
    """

    def allow(self, q: Rows, k: Rows) -> torch.Tensor:
        raise NotImplementedError

    def final_rows(self, rows: Rows, segment: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(rows.is_clean, dtype=torch.bool)


_INSTANCES: dict[type, AttentionRule] = {}


def rule_named(name: str, field: str = "attn_rule") -> AttentionRule:
    """The shared instance of the rule named `name` (or at a dotted path); ValueError naming `field`."""
    cls = RULES.get(name, field)
    if not (isinstance(cls, type) and issubclass(cls, AttentionRule)):
        raise ValueError(f"{field}={name!r}: {cls!r} is not a lumina.attention.rules.AttentionRule subclass")
    if cls not in _INSTANCES:
        _INSTANCES[cls] = cls()
    return _INSTANCES[cls]


def resolve_rule(name: str, uses_blocks: bool, field: str = "attn_rule") -> AttentionRule:
    """`name`'s rule; "auto" is the official choice: "full" when the pack uses block ids (any >= 0), else
    "simple"."""
    if name == AUTO:
        name = "full" if uses_blocks else "simple"
    return rule_named(name, field)


def check_rule_name(name: str, field: str = "attn_rule") -> None:
    """Raise ValueError naming `field` unless `name` is "auto" or names a rule."""
    if name != AUTO:
        rule_named(name, field)


def turn_groups(rows: Rows, segment: torch.Tensor) -> torch.Tensor:
    """[S] int64 index of each row's (segment, turn) group."""
    return torch.unique(torch.stack([segment.long(), rows.turn.long()]), dim=1, return_inverse=True)[1]


def any_in_group(flag: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[S] bool: some row of the row's group has `flag`."""
    hits = torch.zeros(int(group.max()) + 1 if group.numel() else 0, dtype=torch.long, device=flag.device)
    hits.index_add_(0, group, flag.long())
    return hits[group] > 0


def noisy_answer(rows: Rows) -> torch.Tensor:
    """Rows whose tokens change while decoding: type 3 or 4, is_clean false."""
    return ~rows.is_clean & ((rows.type == TEXT_ANSWER) | (rows.type == IMAGE_ANSWER))


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

    allowed = same segment & valid(q) & valid(k) & (the `auto` rule, when turn_ids or is_clean is given; a
    missing one is all zeros, a missing type_ids all 1). Tail positions (>= cu_seqlens[-1]) join the last
    segment, as in the official mask. O(S^2) memory: for tests and reference use.
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
    rule = resolve_rule(AUTO, block_ids is not None and bool((block_ids >= 0).any()))
    blocks = block_ids if block_ids is not None else zeros
    rows = Rows(clean, turn, blocks, types)
    return allowed & rule.allow(Rows(*(t[:, :, None] for t in rows)), Rows(*(t[:, None, :] for t in rows)))
