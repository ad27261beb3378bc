"""Stand-in for atoken_inference.model (see the package docstring)."""
