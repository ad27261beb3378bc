"""MoE routers chosen by name (`LuminaConfig.score_function`): the contract in `base`, one module per router."""

from lumina.model.routers.base import ROUTERS, MoERouter, PackRows, Routing
from lumina.model.routers.sigmoid import SigmoidRouter

__all__ = ["ROUTERS", "MoERouter", "PackRows", "Routing", "SigmoidRouter"]
