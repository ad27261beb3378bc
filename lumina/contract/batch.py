"""`PackedBatch`: the one micro-batch contract between the data pipeline, the model and the samplers.

One pack per micro-batch (B = 1). Shapes after normalisation:
    input_ids, labels            [1, S, C] int64 (labels -100 where unsupervised; labels may be None; labels'
                                 values are checked where they enter the model: `check_labels`)
    type_ids, turn_ids,
    block_ids, position_ids      [1, S] int64
    is_clean, token_valid        [1, S] bool
    noise_t                      [1, S] float32 (noise level of answer tokens, 0 elsewhere)
    answer_mask                  [1, S] bool (answer tokens, masked or not)
    cu_seqlens                   [n + 1] int32 (segment starts + end of the packed part)
    seg_bounds                   the same as a Python tuple, computed on CPU by the collator
    query_rows                   optional [N] int64 flat row indices (b*S + s) whose logits samplers want
    whole, window_start          optional: the whole pack when this batch is a window of its rows starting at
                                 row window_start (sequence parallelism, `window`); cu_seqlens / seg_bounds
                                 then describe the whole pack and attention specs are built from it

Rows past cu_seqlens[-1] are tail padding, filled with `TAIL_FILL` (input_ids: the pad id).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from lumina.contract.roles import IGNORE_INDEX, TokenType

_FLOAT_EXACT_LIMIT = 2**24  # float32 holds every integer below this exactly
# per-row fields of a tail-padding row (token_valid false: attends nothing, supervises nothing)
TAIL_FILL: dict[str, int | float | bool] = {
    "labels": IGNORE_INDEX, "type_ids": TokenType.PAD, "turn_ids": 0, "block_ids": -1, "position_ids": 0,
    "is_clean": False, "token_valid": False, "noise_t": 0.0, "answer_mask": False,
}
ROW_FIELDS = ("input_ids", "labels", *(name for name in TAIL_FILL if name != "labels"))  # [1, S, ...] fields


def as_int_tuple(name: str, values) -> tuple[int, ...]:  # noqa: ANN001 - any sequence of numbers
    """Host integers; fractional values raise (never truncated)."""
    fractional = [v for v in values if int(v) != v]
    if fractional:
        raise ValueError(f"{name} must hold integers, got {fractional[:4]} in {list(values)}")
    return tuple(int(v) for v in values)


def as_int64(name: str, t: torch.Tensor) -> torch.Tensor:
    """Widen an id/label tensor to int64; refuse dtypes that cannot hold token ids exactly."""
    if t.dtype == torch.int64:
        return t
    if t.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        return t.long()
    if t.dtype in (torch.float16, torch.bfloat16):
        raise ValueError(f"{name} has dtype {t.dtype}, which cannot hold token ids exactly; pass an integer tensor")
    if t.dtype == torch.float32 or t.dtype == torch.float64:
        if t.numel():
            fractional = t != t.round()
            if fractional.any():
                raise ValueError(f"{name} has non-integral values, e.g. {t[fractional][:4].tolist()}")
            too_big = t.abs() >= _FLOAT_EXACT_LIMIT
            if too_big.any():
                raise ValueError(f"{name} has values >= 2^24 that {t.dtype} may not hold exactly, "
                                 f"e.g. {t[too_big][:4].tolist()}")
        return t.long()
    raise ValueError(f"{name} has dtype {t.dtype}; expected an integer tensor")


def _row_length(t: torch.Tensor) -> int | None:
    """S of a per-row field given as [S], [1, S], [S, C] or [1, S, C] (None for other shapes)."""
    if t.dim() == 1:
        return t.shape[0]
    if t.dim() == 2:
        return t.shape[1] if t.shape[0] == 1 else t.shape[0]
    return t.shape[1] if t.dim() == 3 and t.shape[0] == 1 else None


def check_row_lengths(fields: dict[str, torch.Tensor | None]) -> None:
    """Per-row fields of one batch must agree on S: else one ValueError naming each field and its length."""
    lengths = {name: _row_length(t) for name, t in fields.items() if isinstance(t, torch.Tensor)}
    if len({n for n in lengths.values() if n is not None}) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in lengths.items() if n is not None)
        raise ValueError(f"PackedBatch fields disagree in length (rows S): {listed}")


def as_row(name: str, t: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
    """[S] -> [1, S]; [1, S] stays. Checks S against `seq_len` when given."""
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[0] != 1:
        raise ValueError(f"{name} must have shape [S] or [1, S], got {list(t.shape)}")
    if seq_len is not None and t.shape[1] != seq_len:
        raise ValueError(f"{name} has length {t.shape[1]}, expected S={seq_len}")
    return t


def as_token_grid(name: str, t: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Token ids or labels to [1, S, C]. Accepts [S, C], [1, S, C], and the legacy text-only [1, S] / [S]
    (one column). A 2-D tensor is resolved against S, never guessed from its last dim."""
    t = as_int64(name, t)
    if t.dim() == 1:
        if t.shape[0] != seq_len:
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [S={seq_len}]")
        return t.view(1, seq_len, 1)
    if t.dim() == 2:
        if t.shape == (1, seq_len):
            return t.unsqueeze(-1)
        if t.shape[0] == seq_len:
            return t.unsqueeze(0)
        raise ValueError(f"{name} has shape {list(t.shape)}; expected [S, C] or [1, S] with S={seq_len}")
    if t.dim() == 3 and t.shape[:2] == (1, seq_len):
        return t
    raise ValueError(f"{name} has shape {list(t.shape)}; expected [1, S, C] with S={seq_len}")


def as_labels(labels: torch.Tensor, seq_len: int, num_cols: int) -> torch.Tensor:
    """Labels to [1, S, C] int64, the one shape normalisation of labels. Accepts what `as_token_grid` does;
    a one-column (legacy text-only) label fills column 0 and the other C - 1 columns become IGNORE_INDEX."""
    labels = as_token_grid("labels", labels, seq_len)
    if labels.shape[-1] == num_cols:
        return labels
    if labels.shape[-1] != 1:
        raise ValueError(f"labels has {labels.shape[-1]} columns, input_ids has {num_cols} (or pass 1 column)")
    full = labels.new_full((1, seq_len, num_cols), IGNORE_INDEX)
    full[..., 0] = labels[..., 0]
    return full


def as_bool_row(name: str, t: torch.Tensor, seq_len: int) -> torch.Tensor:
    t = as_row(name, t, seq_len)
    if t.dtype == torch.bool:
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"{name} has dtype {t.dtype}; expected bool or 0/1 integers")
    if ((t != 0) & (t != 1)).any():
        raise ValueError(f"{name} must be 0/1, found values {t.unique()[:6].tolist()}")
    return t.bool()


@dataclass
class PackedBatch:
    input_ids: torch.Tensor
    type_ids: torch.Tensor
    turn_ids: torch.Tensor
    block_ids: torch.Tensor
    position_ids: torch.Tensor
    is_clean: torch.Tensor
    token_valid: torch.Tensor
    cu_seqlens: torch.Tensor
    labels: torch.Tensor | None = None
    noise_t: torch.Tensor | None = None
    answer_mask: torch.Tensor | None = None
    seg_bounds: tuple[int, ...] | None = None
    query_rows: torch.Tensor | None = None
    whole: PackedBatch | None = None
    window_start: int = 0

    def __post_init__(self) -> None:
        check_row_lengths({name: getattr(self, name) for name in ROW_FIELDS})
        self.type_ids = as_int64("type_ids", as_row("type_ids", self.type_ids))
        seq_len = self.type_ids.shape[1]
        self.input_ids = as_token_grid("input_ids", self.input_ids, seq_len)
        for name in ("turn_ids", "block_ids", "position_ids"):
            setattr(self, name, as_int64(name, as_row(name, getattr(self, name), seq_len)))
        self.is_clean = as_bool_row("is_clean", self.is_clean, seq_len)
        self.token_valid = as_bool_row("token_valid", self.token_valid, seq_len)
        if self.labels is not None:
            self.labels = as_labels(self.labels, seq_len, self.input_ids.shape[-1])
        if self.noise_t is None:
            self.noise_t = torch.zeros(1, seq_len, dtype=torch.float32, device=self.type_ids.device)
        self.noise_t = as_row("noise_t", self.noise_t, seq_len).float()
        if self.answer_mask is None:
            self.answer_mask = torch.zeros(1, seq_len, dtype=torch.bool, device=self.type_ids.device)
        self.answer_mask = as_bool_row("answer_mask", self.answer_mask, seq_len)
        cu = self.cu_seqlens
        if not isinstance(cu, torch.Tensor):
            cu = torch.tensor(cu)  # no dtype: as_int64 refuses fractional values instead of truncating them
        if cu.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D [n + 1], got shape {list(cu.shape)}")
        self.cu_seqlens = as_int64("cu_seqlens", cu).to(torch.int32)
        if self.seg_bounds is not None:
            self.seg_bounds = as_int_tuple("seg_bounds", self.seg_bounds)
        if self.query_rows is not None:
            self.query_rows = as_int64("query_rows", self.query_rows).reshape(-1)

    @property
    def seq_len(self) -> int:
        return self.type_ids.shape[1]

    @property
    def num_codebooks(self) -> int:
        return self.input_ids.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> PackedBatch:
        """Move every tensor, and the whole pack of a window (seg_bounds stays a host tuple). From pinned host
        memory (`pin_memory`, the DataLoader's `pin_memory=True`) the copies are asynchronous."""
        changes: dict[str, object] = {f.name: (t := getattr(self, f.name)).to(device, non_blocking=t.is_pinned())
                                      for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        if self.whole is not None:
            changes["whole"] = self.whole.to(device)
        return dataclasses.replace(self, **changes)

    def pin_memory(self) -> PackedBatch:
        """Every tensor in page-locked host memory (what the DataLoader's pin-memory thread calls)."""
        changes: dict[str, object] = {f.name: getattr(self, f.name).pin_memory() for f in dataclasses.fields(self)
                                      if isinstance(getattr(self, f.name), torch.Tensor)}
        if self.whole is not None:
            changes["whole"] = self.whole.pin_memory()
        return dataclasses.replace(self, **changes)

    def padded(self, seq_len: int, pad_id: int) -> PackedBatch:
        """This pack with invalid tail rows appended up to `seq_len` rows (`TAIL_FILL`, input_ids = pad_id);
        the same object when it already has `seq_len` rows. Never shortens a pack."""
        extra = seq_len - self.seq_len
        if extra < 0:
            raise ValueError(f"padded(seq_len={seq_len}): the pack already has {self.seq_len} rows")
        if extra == 0:
            return self
        if self.whole is not None or self.query_rows is not None:
            raise ValueError("padded(): pad the whole pack, before taking windows or query rows")
        fill = {**TAIL_FILL, "input_ids": pad_id}
        changes = {}
        for name in ROW_FIELDS:
            t = getattr(self, name)
            if t is None:
                continue
            tail = torch.full((1, extra, *t.shape[2:]), fill[name], dtype=t.dtype, device=t.device)
            changes[name] = torch.cat([t, tail], dim=1)
        return dataclasses.replace(self, **changes)

    def window(self, start: int, stop: int) -> PackedBatch:
        """Rows [start, stop) as a batch of their own whose `whole` is this pack (attention still sees every
        row of it through the spec). Row fields are views; cu_seqlens and seg_bounds stay the whole pack's."""
        if not 0 <= start < stop <= self.seq_len:
            raise ValueError(f"window [{start}, {stop}) is not a non-empty row range of a pack of "
                             f"{self.seq_len} rows")
        if self.whole is not None or self.query_rows is not None:
            raise ValueError("window(): take windows of a whole training pack (no nested windows, no query_rows)")
        rows = {name: getattr(self, name)[:, start:stop] for name in ROW_FIELDS if getattr(self, name) is not None}
        return dataclasses.replace(self, **rows, whole=self, window_start=start)

    @property
    def pack_len(self) -> int:
        """Rows of the whole pack (this batch's own rows unless it is a window)."""
        return self.whole.seq_len if self.whole is not None else self.seq_len


def segment_ids(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[S] int64 segment index of every position; tail positions (>= cu_seqlens[-1]) get n (no segment)."""
    positions = torch.arange(seq_len, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)
