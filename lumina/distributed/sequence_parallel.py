"""Sequence parallelism (DeepSpeed-Ulysses style): one pack spread over the `sp` consecutive ranks of a group.

`SequenceShard.local` keeps this rank's S/sp consecutive rows of the group's pack (a `PackedBatch.window`: the
attention spec is built for the whole pack); all but attention runs on the local rows. `UlyssesAttention`
(each layer's `Attention.core`) all-to-alls q/k/v so each rank holds all S rows for nh/sp query heads,
attends, and all-to-alls the output back. Per layer and rank it sends (S/sp) * (nh + 2 max(nkv, sp)) * hd *
(sp-1)/sp elements in and (S/sp) * nh * hd * (sp-1)/sp out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lumina.attention import attend
from lumina.contract.batch import PackedBatch
from lumina.distributed.all_to_all import all_to_all
from lumina.model.attention import AttentionCore


def check_heads(sp: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise ValueError naming strategy.parallel.sp when the heads cannot be split over sp ranks."""
    if num_heads % sp:
        raise ValueError(f"strategy.parallel.sp={sp} does not divide num_attention_heads={num_heads} "
                         "(each sequence-parallel rank attends with num_attention_heads / sp query heads)")
    if num_kv_heads % sp and sp % num_kv_heads:
        raise ValueError(f"strategy.parallel.sp={sp} and num_key_value_heads={num_kv_heads}: one must divide "
                         "the other (kv heads are split over the ranks, or replicated when fewer than sp)")


class SequenceShard:
    """This rank's window of a pack: rank `rank` of a sequence-parallel group of `size` ranks."""

    def __init__(self, rank: int, size: int, pad_id: int) -> None:
        self.rank, self.size, self.pad_id = rank, size, pad_id

    def local(self, batch: PackedBatch) -> PackedBatch:
        """The whole pack [1, S, ...] -> this rank's rows [1, S'/sp, ...], S' = S rounded up to sp."""
        rows = -(-batch.seq_len // self.size)
        whole = batch.padded(rows * self.size, self.pad_id)
        return whole.window(self.rank * rows, (self.rank + 1) * rows)


class UlyssesAttention:
    """An `Attention.core` for a sequence-parallel group: q [B, nh, s, hd], k/v [B, nkv, s, hd] of this rank's
    s = S/sp rows -> [B, nh, s, hd], attending over all S rows of the pack through `inner`."""

    def __init__(self, group: dist.ProcessGroup, num_heads: int, num_kv_heads: int,
                 inner: AttentionCore = attend) -> None:
        self.group = group
        self.sp = dist.get_world_size(group)
        check_heads(self.sp, num_heads, num_kv_heads)
        self.num_heads, self.num_kv_heads, self.inner = num_heads, num_kv_heads, inner
        self.kv_repeat = max(1, self.sp // num_kv_heads)  # kv heads fewer than sp: each serves several ranks

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: object) -> torch.Tensor:
        sp, (batch, _, rows, head_dim) = self.sp, q.shape
        if self.kv_repeat > 1:
            k, v = k.repeat_interleave(self.kv_repeat, dim=1), v.repeat_interleave(self.kv_repeat, dim=1)
        q_heads, kv_heads = self.num_heads // sp, k.shape[1] // sp
        # head chunk j of q, k and v goes to rank j: [sp, B, q_heads + 2 kv_heads, s, hd]
        send = torch.cat([t.view(batch, sp, t.shape[1] // sp, rows, head_dim) for t in (q, k, v)], dim=2)
        received = self._exchange(send.transpose(0, 1))  # [sp (row chunk), B, heads, s, hd]
        full = received.permute(1, 2, 0, 3, 4).reshape(batch, -1, sp * rows, head_dim)  # [B, heads, S, hd]
        q_full, k_full, v_full = full.split([q_heads, kv_heads, kv_heads], dim=1)
        out = self.inner(q_full, k_full, v_full, spec)  # [B, nh/sp, S, hd]
        # row chunk j of the output goes back to rank j: [sp, B, nh/sp, s, hd]
        back = self._exchange(out.view(batch, q_heads, sp, rows, head_dim).permute(2, 0, 1, 3, 4))
        return back.transpose(0, 1).reshape(batch, self.num_heads, rows, head_dim)  # [sp (head chunk)] -> nh

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        """x [sp, ...]: slice j goes to rank j; returns [sp, ...] with slice j from rank j (differentiable)."""
        ones = [1] * self.sp
        return all_to_all(x.contiguous(), ones, ones, self.group)
