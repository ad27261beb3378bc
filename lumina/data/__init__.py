"""Data: samples on disk -> block-diffusion training sequences -> packed batches (storage, roots, layout,
noise, packing, the epoch plan, sources, mixtures and the DataModule)."""
