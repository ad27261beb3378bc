"""HF checkpoint interop: official key names, split/fused expert layouts, streaming load, sharded export and
layout conversion."""

from lumina.checkpoint.convert import convert_checkpoint
from lumina.checkpoint.keys import (
    official_buffer_dtype,
    official_shapes,
    parse_split_expert_key,
    split_expert_key,
)
from lumina.checkpoint.load import load_hf_state_dict_into, load_pretrained, materialise_leftovers
from lumina.checkpoint.reader import HFCheckpoint
from lumina.checkpoint.save import resolve_dtype, save_pretrained
from lumina.checkpoint.tensor_match import CheckpointMismatchError
from lumina.checkpoint.writer import PlannedTensor, export_plan, parse_size

__all__ = [
    "CheckpointMismatchError", "HFCheckpoint", "PlannedTensor", "convert_checkpoint", "export_plan",
    "load_hf_state_dict_into", "load_pretrained", "materialise_leftovers", "official_buffer_dtype",
    "official_shapes", "parse_size", "parse_split_expert_key", "resolve_dtype", "save_pretrained",
    "split_expert_key",
]
