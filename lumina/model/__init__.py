"""Single-device InternLumina-U2 model code."""

from lumina.model.config import LuminaConfig
from lumina.model.dispatch import LocalDispatcher, MoEDispatcher
from lumina.model.experts import GroupedExperts
from lumina.model.image_heads import IMAGE_HEADS, ImageHead
from lumina.model.image_heads.channel_ar import MultiCodebookHead
from lumina.model.lumina_model import LuminaModel
from lumina.model.moe import MoE
from lumina.model.output import LuminaOutput
from lumina.model.routers import ROUTERS, MoERouter, PackRows, Routing, SigmoidRouter

__all__ = [
    "GroupedExperts",
    "IMAGE_HEADS",
    "ImageHead",
    "LocalDispatcher",
    "LuminaConfig",
    "LuminaModel",
    "LuminaOutput",
    "MoE",
    "MoEDispatcher",
    "MultiCodebookHead",
    "MoERouter",
    "PackRows",
    "ROUTERS",
    "Routing",
    "SigmoidRouter",
]
