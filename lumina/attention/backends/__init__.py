"""Attention backends; each module has `unavailable(q, spec) -> str | None` and `forward(q, k, v, spec)`."""
