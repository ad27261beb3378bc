"""HF checkpoint interop: official key names, split/fused expert layouts, streaming load, sharded export and
layout conversion."""

from lumina.checkpoint.convert import convert_checkpoint
from lumina.checkpoint.keys import (
    LAYOUTS,
    MODEL_TYPE_OF_LAYOUT,
    official_buffer_dtype,
    official_shapes,
    parse_split_expert_key,
    split_expert_key,
)
from lumina.checkpoint.layout import CheckpointMismatchError, match_checkpoint
from lumina.checkpoint.load import load_hf_state_dict_into, load_pretrained, materialise_leftovers
from lumina.checkpoint.reader import INDEX_FILE, SINGLE_FILE, HFCheckpoint, TensorInfo
from lumina.checkpoint.save import ASSET_PATTERNS, copy_assets, resolve_dtype, save_pretrained
from lumina.checkpoint.writer import PlannedTensor, export_plan, parse_size

__all__ = [
    "ASSET_PATTERNS", "INDEX_FILE", "LAYOUTS", "MODEL_TYPE_OF_LAYOUT", "SINGLE_FILE", "CheckpointMismatchError",
    "HFCheckpoint", "PlannedTensor", "TensorInfo", "convert_checkpoint", "copy_assets", "export_plan",
    "load_hf_state_dict_into", "load_pretrained", "match_checkpoint", "materialise_leftovers",
    "official_buffer_dtype", "official_shapes", "parse_size", "parse_split_expert_key", "resolve_dtype",
    "save_pretrained", "split_expert_key",
]
