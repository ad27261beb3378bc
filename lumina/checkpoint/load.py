"""Stream an HF checkpoint (any expert layout) into a model, shard by shard: meta tensors are replaced by the
checkpoint's, so peak memory stays near one copy of the weights; tensors holding data are filled in place.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lumina.checkpoint.reader import HFCheckpoint, open_shard
from lumina.checkpoint.save import resolve_dtype
from lumina.checkpoint.tensor_match import Whole, match_checkpoint
from lumina.checkpoint.writer import export_dtype

if TYPE_CHECKING:
    from lumina.model import LuminaModel


class _Slot:
    """The parameter or buffer behind one state-dict key."""

    def __init__(self, model: nn.Module, key: str) -> None:
        module_name, _, self.name = key.rpartition(".")
        self.key = key
        self.module = model.get_submodule(module_name)
        self.is_param = self.name in self.module._parameters
        if not self.is_param and self.name not in self.module._buffers:
            raise KeyError(f"{key} is neither a parameter nor a buffer of {module_name or 'the model'}")

    @property
    def tensor(self) -> torch.Tensor:
        store = self.module._parameters if self.is_param else self.module._buffers
        return store[self.name]

    def assign(self, value: torch.Tensor) -> None:
        if self.is_param:
            self.module._parameters[self.name] = nn.Parameter(value, requires_grad=self.tensor.requires_grad)
        else:
            self.module._buffers[self.name] = value


def load_hf_state_dict_into(model: nn.Module, path: str | Path, *, dtype: torch.dtype | str | None = None,
                            device: torch.device | str | None = None) -> nn.Module:
    """Load checkpoint directory `path` into `model` (keys and shapes checked first); returns `model`. Meta
    tensors become checkpoint tensors on `device` (cpu), parameters cast to `dtype` if given; tensors holding
    data are filled in place and must agree with a given dtype / device. Non-persistent buffers stay."""
    out_dtype = resolve_dtype(dtype)
    checkpoint = HFCheckpoint(path)
    expected = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    sources = match_checkpoint(checkpoint.tensors, expected, where=str(path))
    slots = {key: _Slot(model, key) for key in expected}
    _check_materialised(slots, sources, out_dtype, None if device is None else torch.device(device))
    device = torch.device("cpu" if device is None else device)

    reads: dict[Path, list[tuple[str, str, int | None]]] = defaultdict(list)  # file -> (ckpt key, key, expert)
    for key, source in sources.items():
        if isinstance(source, Whole):
            reads[source.info.file].append((source.key, key, None))
        else:
            for expert, (split_key, info) in enumerate(zip(source.keys, source.infos, strict=True)):
                reads[info.file].append((split_key, key, expert))
    for file in checkpoint.files:
        if not reads[file]:
            continue
        with open_shard(file) as handle, torch.no_grad():
            for checkpoint_key, key, expert in reads[file]:
                _place(slots[key], handle.get_tensor(checkpoint_key), expert, expected[key], out_dtype, device)
    return model


def _check_materialised(slots: dict[str, _Slot], sources: dict[str, Any], out_dtype: torch.dtype | None,
                        device: torch.device | None) -> None:
    """Refuse a requested dtype/device that tensors already holding data do not have (they are filled in place)."""
    clashes = []
    for key, slot in slots.items():
        current = slot.tensor
        if current.is_meta:
            continue
        source = sources[key]
        source_dtype = source.info.dtype if isinstance(source, Whole) else source.infos[0].dtype
        wanted = export_dtype(key, source_dtype, out_dtype)
        if out_dtype is not None and current.dtype != wanted:
            clashes.append(f"{key} ({current.dtype}, wanted {wanted})")
        if device is not None and (current.device.type != device.type
                                   or device.index is not None and current.device.index != device.index):
            clashes.append(f"{key} (on {current.device}, wanted {device})")
    if clashes:
        raise ValueError(f"dtype={out_dtype}, device={device} disagree with tensors that already hold data; move or "
                         f"cast the model, or build it on the meta device: {', '.join(clashes)}")


def _place(slot: _Slot, value: torch.Tensor, expert: int | None, shape: tuple[int, ...],
           out_dtype: torch.dtype | None, device: torch.device) -> None:
    """Put checkpoint tensor `value` (slice `expert` of a fused tensor, or the whole tensor) into `slot`."""
    current = slot.tensor
    if current.is_meta:
        wanted = export_dtype(slot.key, value.dtype, out_dtype)
        if expert is None:  # copy=True: safetensors returns tensors backed by the file's memory map
            slot.assign(value.to(device=device, dtype=wanted, copy=True))
            return
        slot.assign(torch.empty(shape, dtype=wanted, device=device))
        current = slot.tensor
    (current if expert is None else current[expert]).copy_(value)


def materialise_leftovers(model: nn.Module, device: torch.device | str = "cpu") -> None:
    """`reset_parameters()` the modules owning tensors still on meta (not for modules with loaded ones)."""
    persistent = set(model.state_dict().keys())
    for name, module in model.named_modules():
        own = {**module._parameters, **module._buffers}
        on_meta = [n for n, t in own.items() if t is not None and t.is_meta]
        if not on_meta:
            continue
        prefix = f"{name}." if name else ""
        what = f"cannot materialise {[prefix + n for n in on_meta]}: module {name or type(module).__name__}"
        loaded_here = [prefix + n for n in own if prefix + n in persistent]
        if loaded_here:
            raise RuntimeError(f"{what} also owns loaded tensors {loaded_here} that reset_parameters() would overwrite")
        if not hasattr(module, "reset_parameters"):
            raise RuntimeError(f"{what} has no reset_parameters()")
        module.to_empty(device=device, recurse=False)
        module.reset_parameters()


def load_pretrained(path: str | Path, *, dtype: torch.dtype | str | None = None, device: torch.device | str = "cpu",
                    **config_overrides: Any) -> LuminaModel:
    """The `LuminaModel` of `path` (config.json + `config_overrides`), built on meta and streamed in."""
    from lumina.model import LuminaModel  # imported here so that lumina.model may import lumina.checkpoint

    config = HFCheckpoint(path).config(**config_overrides)
    with torch.device("meta"):
        model = LuminaModel(config)
    load_hf_state_dict_into(model, path, dtype=dtype, device=device)
    materialise_leftovers(model, device)
    return model
