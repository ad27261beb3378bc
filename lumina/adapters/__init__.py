"""Adapters chosen by name (the config's `adapter.name`): the contract in `base`, one module per adapter
(`lora`), and what reads and writes them (`merge`, `peft_format`)."""

from lumina.adapters.base import ADAPTERS, Adapter, NoAdapter
from lumina.adapters.lora import LoRA, LoRAGroupedExperts, LoRALinear, lora_modules
from lumina.adapters.merge import merge_adapter, merged_state_dict
from lumina.adapters.peft_format import load_peft_adapter, save_peft_adapter

__all__ = ["ADAPTERS", "Adapter", "LoRA", "LoRAGroupedExperts", "LoRALinear", "NoAdapter",
           "load_peft_adapter", "lora_modules", "merge_adapter", "merged_state_dict", "save_peft_adapter"]
