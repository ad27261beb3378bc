"""The seed's hang: rank 1's pack has no image targets (rank 0's has).

- once-per-micro-batch rule on: trains several steps;
- rule off, participation check on: every rank raises ParticipationError naming the modules and ranks;
- rule off, check off (the seed run): fails inside backward with a collective error or the process-group
  timeout, within that timeout (its own launch: the failed collective poisons the process group).
"""

from __future__ import annotations

import math
import re

COLLECTIVE_FAILURE = re.compile(r"timed out|timeout|Timeout|mismatch|Connection closed|Gloo|gloo|collective",
                                re.IGNORECASE)


def test_rule_on_trains_several_steps(core) -> None:
    for rank in (0, 1):
        losses = core("conditional", rank)["rule_on_losses"]
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


def test_participation_check_names_the_modules_and_ranks(core) -> None:
    for rank in (0, 1):
        kind, message = core("conditional", rank)["check_error"]
        assert kind == "ParticipationError"
        assert "multi_codebook_head (joined backward on ranks [0], absent on ranks [1])" in message
        assert "lm_img_head.0" in message
        assert "word_embeddings" not in message and "lm_head " not in message  # text ran on both ranks


def _phases(output: str) -> list[tuple[str, float]]:
    return [(m.group(1), float(m.group(2))) for m in re.finditer(r"^PHASE (\w+) ([\d.]+)$", output, re.MULTILINE)]


def test_rule_off_fails_inside_backward_within_the_timeout(hang) -> None:
    """Gloo either aborts the process on the mismatched collective ("Is there a distributed collective
    mismatch in your code?") or raises on the peer; both happen inside the first backward. The strategy gave
    the process group ParallelConfig.timeout_s (15 s here, not the 1800 s default)."""
    timeout_s = 15.0
    failures = 0
    for rank, proc in enumerate(hang.processes):
        phases = _phases(proc.stdout)
        assert re.search(rf"^PG_TIMEOUT {timeout_s:.1f}$", proc.stdout, re.MULTILINE), proc.stdout[-2000:]
        assert [p for p, _ in phases] == ["setup", "forward", "backward"], (rank, phases, proc.stdout[-2000:])
        backward_at = phases[-1][1]
        result = re.search(r"^RESULT ([\d.]+) (.*)$", proc.stdout, re.MULTILINE)
        if proc.returncode != 0:  # aborted by gloo itself
            assert "collective mismatch" in proc.stdout, proc.stdout[-2000:]
            failures += 1
        else:
            assert result is not None and result.group(2) != "None", proc.stdout[-2000:]
            assert COLLECTIVE_FAILURE.search(result.group(2)), result.group(2)
            assert float(result.group(1)) - backward_at < timeout_s
            got = hang("hang", rank)
            assert got["where"] == "backward" and got["error"] is not None
            failures += 1
    assert failures == 2
