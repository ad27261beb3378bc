"""`lumina-generate task=eval` without `eval.data`: the evaluation a plug-in registered under a tokenizer set's
name (the built-in world's: "world"). An evaluation is `evaluate(model, assets, cfg, settings, out) -> out`:
it generates, scores, writes <out>/eval.json (and a sample grid) and prints its metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from lumina.generation.assets import GenerationAssets
from lumina.plugins import PluginRegistry

Evaluation = Callable[[nn.Module, GenerationAssets, DictConfig, DictConfig, Path], Path]
EVALUATIONS: PluginRegistry[Evaluation] = PluginRegistry("evaluation")
