"""Helpers for the storage / build / world tests: sample equality, small hand-made samples, a hostile pickle."""

from __future__ import annotations

import os

import torch

from lumina.contract.schema import Media, Sample, Text, Turn

NEWLINE = 201  # the data tests' stand-in for the official tokenizer's "\n" id (not part of the contract)


def assert_samples_equal(a: Sample, b: Sample) -> None:
    assert (a.id, a.source) == (b.id, b.source)
    assert [t.role for t in a.turns] == [t.role for t in b.turns]
    for k, (ta, tb) in enumerate(zip(a.turns, b.turns, strict=True)):
        assert len(ta.parts) == len(tb.parts), f"turn {k}"
        for pa_, pb in zip(ta.parts, tb.parts, strict=True):
            assert type(pa_) is type(pb)
            if isinstance(pa_, Text):
                assert list(pa_.ids) == list(pb.ids)
            else:
                assert pa_.kind == pb.kind and tuple(pa_.grid) == tuple(pb.grid)
                assert pa_.codes.dtype == pb.codes.dtype == torch.int64
                assert torch.equal(pa_.codes, pb.codes)


def codes(n: int, c: int, high: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, (n, c), generator=torch.Generator().manual_seed(seed))


def mixed_samples(c: int = 8, high: int = 4096) -> list[Sample]:
    """Understanding (image + video + 3-D prompt -> text), t2i (text -> image), and a system + two-exchange chat."""
    return [
        Sample("und-0", [
            Turn("user", [Media("image", codes(6, c, high, 1), (2, 3)), Text([10, 11, 12]),
                          Media("video", codes(2 * 2 * 3, c, high, 2), (2, 2, 3)),
                          Media("mesh3d", codes(2 * 3 * 2, c, high, 3), (2, 3, 2))]),
            Turn("assistant", [Text([20, 21])])], source="und"),
        Sample("t2i-0", [Turn("user", [Text([30, 31, 32, 33])]),
                         Turn("assistant", [Media("image", codes(4 * 5, c, high, 4), (4, 5))])], source="gen"),
        Sample("chat-0", [Turn("system", [Text([5, 6])]), Turn("user", [Text([40])]), Turn("assistant", [Text([41])]),
                          Turn("user", [Text([42, 43])]), Turn("assistant", [Text([44, 45, 46])])]),
    ]


class Shell:
    """A token-file payload that runs `command` when plainly unpickled (what safe loading must refuse)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def mix_items(mix) -> list[tuple[str, int]]:
    """An `EpochMix`'s slots as (source name, index) pairs."""
    return [(mix.names[k], i) for k, i in zip(mix.source.tolist(), mix.index.tolist(), strict=True)]
