"""The adapter's contract (`Adapter`) and the registry of adapters by name (`ADAPTERS`; the config's
`adapter.name` names one, "none" by default). An adapter is applied to a built single-device model from
outside its code, before any sharding, and says which parameters it added: with `freezes_base` those are the
only ones that train (`lumina.training.trainable.mark_trainable`). A new adapter is one module in this
package registering its class with `@ADAPTERS.register("name")`."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from lumina.parts import Registry

ADAPTERS = Registry("adapter", "lumina.adapters")


class Adapter:
    """`apply(model)` changes `model` in place and returns the names of the parameters it added; every base
    parameter and buffer keeps its name, value and state-dict key."""

    #: True: only the adapter's parameters train; the base (its expert bias included) stays bit for bit
    freezes_base: ClassVar[bool] = True

    def apply(self, model: nn.Module) -> list[str]:
        raise NotImplementedError


@ADAPTERS.register("none", official=True)
class NoAdapter(Adapter):
    """No adapter: the model trains as configured (`model.freeze`)."""

    freezes_base: ClassVar[bool] = False

    def apply(self, model: nn.Module) -> list[str]:
        return []
