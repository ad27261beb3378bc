"""The adapter's contract (`Adapter`) and the registry of adapters by name (`ADAPTERS`; the config's
`adapter.name` names one, "none" by default). An adapter is applied to a built single-device model from
outside its code, before any sharding, and says which parameters it added: with `freezes_base` those, and the
parameters of the base modules it trains whole (`saved_modules`, PEFT's `modules_to_save`), are the only ones
that train (`trainable`, applied by `lumina.training.trainable.mark_trainable`). A new adapter is one module in this
package registering its class with `@ADAPTERS.register("name")`."""

from __future__ import annotations

from contextlib import AbstractContextManager
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

    def saved_modules(self, model: nn.Module) -> list[str]:
        """The base modules of the adapted `model` this adapter trains whole and exports beside its own
        parameters (PEFT's `modules_to_save`), by name; none by default."""
        return []

    def trainable(self, model: nn.Module, added: list[str]) -> list[str] | None:
        """The names of the parameters that train on the adapted `model`, `added` being what `apply` returned:
        those plus every parameter of `saved_modules`, or None (all but `model.freeze`) when the base is not
        frozen."""
        if not self.freezes_base:
            return None
        saved = [f"{name}.{param}" for name in self.saved_modules(model)
                 for param, _ in model.get_submodule(name).named_parameters()]
        return [*added, *saved]

    def base_view(self, model: nn.Module) -> AbstractContextManager[nn.Module] | None:
        """A context inside which the adapted `model`, in eval mode, computes what its base computed before
        `apply` (yielding `model`), or None when the adapter gives none (it trains base parameters). A
        post-training loss term's reference model is this view, not a frozen copy of the model."""
        return None


@ADAPTERS.register("none", official=True)
class NoAdapter(Adapter):
    """No adapter: the model trains as configured (`model.freeze`)."""

    freezes_base: ClassVar[bool] = False

    def apply(self, model: nn.Module) -> list[str]:
        return []
