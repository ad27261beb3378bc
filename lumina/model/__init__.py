"""Single-device InternLumina-U2 model code."""

from lumina.model.config import LuminaConfig
from lumina.model.experts import GroupedExperts
from lumina.model.lumina_model import LuminaModel
from lumina.model.moe import MoE
from lumina.model.moe_dispatch import LocalDispatcher
from lumina.model.output import LuminaOutput
from lumina.model.routers import ROUTERS, MoERouter, PackRows, SigmoidRouter

__all__ = [
    "GroupedExperts", "LocalDispatcher", "LuminaConfig", "LuminaModel", "LuminaOutput", "MoE", "MoERouter",
    "PackRows", "ROUTERS", "SigmoidRouter",
]
