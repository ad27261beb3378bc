"""`HFExportCallback`: at the end of training, rank 0 writes the weights as an HF checkpoint directory in the
official split layout (safetensors + config.json, plus the tokenizer files of the source checkpoint and those the
training data records: tokenizer.json, visual_tokenizer/)."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from lumina.checkpoint.save import save_pretrained


class HFExportCallback(L.Callback):
    def __init__(self, dirpath: str, layout: str = "split", dtype: str | None = None,
                 max_shard_size: str = "5GB") -> None:
        self.dirpath = Path(dirpath)
        self.layout = layout
        self.dtype = dtype
        self.max_shard_size = max_shard_size
        self.exported: Path | None = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gather = getattr(trainer.strategy, "consolidated_state_dict", None)  # sharded: every rank joins
        weights = gather(pl_module.model) if gather is not None else pl_module.model
        if not trainer.is_global_zero:
            return
        source_dir = getattr(pl_module, "init_from", None)
        self.exported = save_pretrained(weights, self.dirpath, config=pl_module.model.config, layout=self.layout,
                                        dtype=self.dtype,
                                        max_shard_size=self.max_shard_size, source_dir=source_dir,
                                        overwrite=True)
        export_assets = getattr(trainer.datamodule, "export_assets", None)  # the data's own tokenizers
        if export_assets is not None:
            export_assets(self.exported)
