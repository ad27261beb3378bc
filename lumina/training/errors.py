"""`ConfigError`: a bad training configuration, reported by the CLI as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration mistake the user fixes with an override; the message names the field and value."""
