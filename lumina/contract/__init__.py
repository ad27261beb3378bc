"""The contract every package shares: the packed batch, token roles, the sample schema, the training sequence,
special tokens, system prompts and the task table."""

from lumina.contract.batch import PackedBatch

__all__ = ["PackedBatch"]
