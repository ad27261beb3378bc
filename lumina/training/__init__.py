"""Training: the LightningModule, its callbacks and metrics, and `run(cfg)` behind `lumina-train`."""

from lumina.training.errors import ConfigError
from lumina.training.expert_stats import draw_heatmap, load_stats
from lumina.training.expert_usage import ExpertUsageCallback
from lumina.training.freeze import freeze_parameters
from lumina.training.hf_export import HFExportCallback
from lumina.training.metrics import TokenAccuracies
from lumina.training.module import LuminaModule
from lumina.training.optim import OptimConfig, build_optimizer, build_scheduler, split_decay, warmup_cosine

__all__ = [
    "ConfigError", "ExpertUsageCallback", "HFExportCallback", "LuminaModule", "OptimConfig", "TokenAccuracies",
    "build_optimizer", "build_scheduler", "draw_heatmap", "freeze_parameters", "load_stats",
    "split_decay", "warmup_cosine",
]
