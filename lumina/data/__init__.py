"""Data: samples on disk -> block-diffusion training sequences -> packed batches."""

from lumina.data.batch import PackedBatch

__all__ = ["PackedBatch"]
