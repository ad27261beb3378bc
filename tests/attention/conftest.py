"""Attention tests: no strict mode from the environment unless a test sets it."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_strict_env(monkeypatch):
    monkeypatch.delenv("LUMINA_ATTN_STRICT", raising=False)
