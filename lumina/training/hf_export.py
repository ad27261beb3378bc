"""`HFExportCallback`: at the end of training, rank 0 writes an HF checkpoint directory (safetensors,
config.json and the tokenizers of the source checkpoint and the data). layout "auto": the official split
layout, or the fused one when the model uses a part the released model lacks (`unofficial_parts`). A model
with a LoRA adapter is exported merged (`merged_state_dict`), its adapter beside it in PEFT's format
(`<dirpath>/adapter`, with the modules it trains whole), from the gathered weights when the model is sharded."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lumina.adapters import lora_modules, merged_state_dict, save_peft_adapter
from lumina.checkpoint.official_parts import unofficial_parts
from lumina.checkpoint.save import save_pretrained


class HFExportCallback(L.Callback):
    def __init__(self, dirpath: str, layout: str = "auto", dtype: str | None = None,
                 max_shard_size: str = "5GB") -> None:
        self.dirpath = Path(dirpath)
        self.layout = layout
        self.dtype = dtype
        self.max_shard_size = max_shard_size
        self.exported: Path | None = None
        self.adapter: Path | None = None  # the PEFT-format adapter, when the model has one

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gather = getattr(trainer.strategy, "consolidated_state_dict", None)  # sharded: every rank joins
        model = pl_module.model
        weights = gather(model) if gather is not None else model
        if not trainer.is_global_zero:
            return
        if lora_modules(model):  # the adapter's structure from the model, its values from the weights
            state = weights.state_dict() if isinstance(weights, nn.Module) else weights
            self.adapter = save_peft_adapter(model, self.dirpath / "adapter", overwrite=True, state=state,
                                             modules_to_save=pl_module.adapter.saved_modules(model))
            weights = merged_state_dict(model, state)
        source_dir = getattr(pl_module, "init_from", None)
        config, layout = pl_module.model.config, self.layout
        if layout == "auto":
            parts = unofficial_parts(config)
            layout = "fused" if parts else "split"
            if parts:
                rank_zero_info(f"HF export in lumina's fused layout: {', '.join(parts)} is not a part of the "
                               "released model, so the official split layout cannot hold it")
        self.exported = save_pretrained(weights, self.dirpath, config=config, layout=layout, dtype=self.dtype,
                                        max_shard_size=self.max_shard_size, source_dir=source_dir,
                                        overwrite=True)
        export_assets = getattr(trainer.datamodule, "export_assets", None)  # the data's own tokenizers
        if export_assets is not None:
            export_assets(self.exported)
