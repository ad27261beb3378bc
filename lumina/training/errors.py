"""`ConfigError`: a bad training configuration, reported by the CLI as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """Raised for configuration mistakes the user can fix by changing an override; the message names the
    field and its value."""
