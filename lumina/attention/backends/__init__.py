"""Attention backends; each module has `unavailable(q, k, v, spec) -> str | None` and `forward(q, k, v, spec)`."""
