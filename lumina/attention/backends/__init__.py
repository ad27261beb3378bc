"""Attention backends: each module registers one `lumina.attention.backend.Backend` subclass by name."""
