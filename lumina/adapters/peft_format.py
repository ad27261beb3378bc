"""LoRA adapters in PEFT's on-disk format, for the official split layout (each routed expert its own module):
    adapter_config.json          peft_type LORA, r, lora_alpha, lora_dropout, target_modules (module names),
                                 modules_to_save (module names, or null)
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight [r, in], .lora_B.weight [out, r];
                                 base_model.model.<saved>.<key> for each state-dict key of a saved module
where <module> is an attention / MLP Linear's name (`model.layers.3.attention.dense`) or, for the routed
experts, `model.layers.3.mlp.experts.<e>.<gate_proj|up_proj|down_proj>`, one per expert, and <saved> a module
trained whole (`LoRA.saved_modules`, PEFT's `modules_to_save`: `lm_head.weight`, as PEFT writes it)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lumina.adapters.lora import EXPERT_PROJS, LoRA, LoRAGroupedExperts, LoRALinear, factor_keys, lora_modules

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
_KEY_RE = re.compile(r"^base_model\.model\.(.+)\.(lora_A|lora_B)\.weight$")
_EXPERT_RE = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")


def adapter_tensors(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """PEFT key -> tensor (CPU, contiguous) for every LoRA factor of `model`, the experts' split by expert;
    values from `state` (whole tensors; None: the model's own state dict)."""
    state = model.state_dict() if state is None else state
    out: dict[str, torch.Tensor] = {}
    for name, module in lora_modules(model).items():
        for key, (a_key, b_key) in factor_keys(name, module).items():
            a, b = state[a_key], state[b_key]
            if isinstance(module, LoRALinear):
                pieces = {name: (a, b)}
            else:  # [E, r, in] / [E, out, r]: one PEFT module per expert
                proj = key.rsplit(".", 1)[1]
                pieces = {f"{name}.{e}.{proj}": (a[e], b[e]) for e in range(a.shape[0])}
            for target, (a_e, b_e) in pieces.items():
                out[f"{PREFIX}{target}.lora_A.weight"] = a_e.detach().cpu().contiguous()
                out[f"{PREFIX}{target}.lora_B.weight"] = b_e.detach().cpu().contiguous()
    return out


def saved_tensors(model: nn.Module, modules_to_save: Sequence[str],
                  state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """PEFT key -> tensor (CPU, contiguous) for every state-dict entry of the modules named in `modules_to_save`,
    values from `state` (None: the model's own state dict)."""
    state = model.state_dict() if state is None else state
    return {f"{PREFIX}{name}.{key}": state[f"{name}.{key}"].detach().cpu().contiguous()
            for name in modules_to_save for key in model.get_submodule(name).state_dict()}


def save_peft_adapter(model: nn.Module, directory: str | Path, overwrite: bool = False,
                      state: Mapping[str, torch.Tensor] | None = None,
                      modules_to_save: Sequence[str] = ()) -> Path:
    """Write `model`'s LoRA adapter to `directory` in PEFT's format, its factors' values from `state` (None:
    the model's own; a sharded model's gathered state dict), with the base modules named in `modules_to_save`
    (trained whole: `Adapter.saved_modules`) whole; an adapter already there is refused, or replaced with
    overwrite=True. All adapted modules share one rank, alpha and dropout (PEFT's one `r` and `lora_alpha`)."""
    modules = lora_modules(model)
    if not modules:
        raise ValueError("save_peft_adapter: the model has no LoRA adapter")
    settings = {(m.rank, m.alpha, _dropout(m)) for m in modules.values()}
    if len(settings) != 1:
        raise ValueError("save_peft_adapter: adapted modules differ in (rank, alpha, dropout): "
                         f"{sorted(settings)}")
    (rank, alpha, dropout), = settings
    directory = Path(directory)
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if (directory / file).exists() and not overwrite:
            raise FileExistsError(f"{str(directory / file)!r} exists; refusing to overwrite an adapter")
    tensors = adapter_tensors(model, state)
    targets = sorted({_KEY_RE.match(key).group(1) for key in tensors})
    tensors.update(saved_tensors(model, modules_to_save, state))
    config = {
        "peft_type": "LORA", "task_type": None, "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
        "target_modules": targets, "bias": "none", "use_rslora": False, "use_dora": False,
        "fan_in_fan_out": False, "init_lora_weights": True, "rank_pattern": {}, "alpha_pattern": {},
        "modules_to_save": list(modules_to_save) or None, "base_model_name_or_path": None, "inference_mode": True,
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def _dropout(module: LoRALinear | LoRAGroupedExperts) -> float:
    drop = getattr(module, "lora_dropout", None)
    return float(drop.p) if isinstance(drop, nn.Dropout) else 0.0


def read_adapter_config(directory: Path) -> dict:
    """`adapter_config.json`, checked for what lumina reads: a plain LoRA (no DoRA, rsLoRA, per-module
    rank or alpha, bias or fan_in_fan_out); a ValueError names the file, field and value otherwise."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r}: no adapter config (expected a PEFT adapter directory)")
    config = json.loads(path.read_text())
    wanted = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "bias": "none",
              "fan_in_fan_out": False}
    for field, value in wanted.items():
        if config.get(field, value) != value:
            raise ValueError(f"{str(path)!r}: {field}={config.get(field)!r} is not supported (lumina reads "
                             f"{field}={value!r})")
    for field in ("rank_pattern", "alpha_pattern"):
        if config.get(field):
            raise ValueError(f"{str(path)!r}: {field}={config[field]!r} is not supported (one r and "
                             "lora_alpha for every module)")
    saved = config.get("modules_to_save") or []
    if isinstance(saved, str) or not all(isinstance(m, str) and m for m in saved):
        raise ValueError(f"{str(path)!r}: modules_to_save={saved!r}: expected a list of module names")
    for field in ("r", "lora_alpha"):
        if field not in config:
            raise ValueError(f"{str(path)!r}: no {field!r}")
    return config


def load_peft_adapter(model: nn.Module, directory: str | Path) -> list[str]:
    """Adapt `model` (a plain base, no adapter yet) with the LoRA adapter in PEFT's format at `directory`
    (lumina's or another tool's), in place: the modules its keys name get rank r, alpha lora_alpha and dropout
    lora_dropout, and its factors; the modules its `modules_to_save` names (each the module of that name or
    ending in `.<name>`, as PEFT matches them) take its whole tensors. Every key must name a module of the model
    with the right shapes, each adapted experts module needs factors for all its experts and projections, and
    each saved module every state-dict entry. Returns the LoRA parameter names (as `LoRA.apply`)."""
    directory = Path(directory)
    config = read_adapter_config(directory)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"{str(weights_path)!r}: no adapter weights")
    tensors = load_file(str(weights_path))
    saved = _saved_modules(model, config.get("modules_to_save") or [], directory / CONFIG_FILE)
    whole = {f"{PREFIX}{name}.{key}": (name, key) for name in saved
             for key in model.get_submodule(name).state_dict()}
    factors: dict[str, dict[str, torch.Tensor]] = {}  # module name -> {"lora_A": ..., "lora_B": ...}
    for key, tensor in tensors.items():
        if key in whole:
            continue
        match = _KEY_RE.match(key)
        if match is None:
            raise ValueError(f"{str(weights_path)!r}: key {key!r} is not a LoRA factor "
                             "(base_model.model.<module>.lora_A.weight / .lora_B.weight)")
        factors.setdefault(match.group(1), {})[match.group(2)] = tensor
    modules = dict(model.named_modules())
    targets: list[str] = []
    for target in factors:
        expert = _EXPERT_RE.match(target)
        name = expert.group(1) if expert else target
        if name not in modules:
            raise ValueError(f"{str(weights_path)!r}: {target!r} names no module of the model")
        if name not in targets:
            targets.append(name)
    adapter = LoRA(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                   dropout=float(config.get("lora_dropout") or 0.0), targets=[_exact(t) for t in targets])
    names = adapter.apply(model)
    with torch.no_grad():
        for name, module in lora_modules(model).items():
            if isinstance(module, LoRALinear):
                _copy(module.lora_A.weight, _factor(factors, name, "lora_A", weights_path), name, "lora_A")
                _copy(module.lora_B.weight, _factor(factors, name, "lora_B", weights_path), name, "lora_B")
                continue
            for proj in EXPERT_PROJS:
                for e in range(module.num_local_experts):
                    target = f"{name}.{e}.{proj}"
                    for which in ("lora_A", "lora_B"):
                        param = getattr(module, which)[proj][e]
                        _copy(param, _factor(factors, target, which, weights_path), target, which)
        for key, (name, entry) in whole.items():
            if key not in tensors:
                raise ValueError(f"{str(weights_path)!r}: no {key} (modules_to_save names {name!r}, whose "
                                 "every state-dict entry the adapter must hold)")
            target = model.get_submodule(name).state_dict(keep_vars=True)[entry]
            if tuple(tensors[key].shape) != tuple(target.shape):
                raise ValueError(f"{str(weights_path)!r}: {key} has shape {list(tensors[key].shape)}, the model "
                                 f"needs {list(target.shape)}")
            target.copy_(tensors[key].to(target.dtype))
    return names


def _saved_modules(model: nn.Module, entries: Sequence[str], path: Path) -> list[str]:
    """The module names of `model` PEFT's `modules_to_save` entries select (the name itself or ending in
    `.<entry>`); a ValueError names an entry that selects none."""
    names = [name for name, _ in model.named_modules() if name]
    chosen: list[str] = []
    for entry in entries:
        hits = [name for name in names if name == entry or name.endswith(f".{entry}")]
        if not hits:
            raise ValueError(f"{str(path)!r}: modules_to_save entry {entry!r} names no module of the model")
        chosen.extend(hit for hit in hits if hit not in chosen)
    return chosen


def _exact(name: str) -> str:
    """A glob matching exactly `name` (module names hold no glob characters but `[`, escaped here)."""
    return name.replace("[", "[[]")


def _factor(factors: dict[str, dict[str, torch.Tensor]], target: str, which: str, path: Path) -> torch.Tensor:
    found = factors.get(target, {}).get(which)
    if found is None:
        raise ValueError(f"{str(path)!r}: no {PREFIX}{target}.{which}.weight (an adapted module needs both "
                         "factors, for every expert)")
    return found


def _copy(param: torch.Tensor, tensor: torch.Tensor, target: str, which: str) -> None:
    if tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(f"{PREFIX}{target}.{which}.weight has shape {list(tensor.shape)}, the model needs "
                         f"{list(param.shape)} (rank r and the module's in/out features)")
    param.copy_(tensor.to(param.dtype))
