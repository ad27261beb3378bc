"""Training: the LightningModule, its callbacks and metrics, and `run(cfg)` behind `lumina-train`."""
