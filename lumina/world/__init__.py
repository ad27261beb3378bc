"""The built-in procedural scene world: scenes, the ground-truth checker, tasks and the dataset."""

from lumina.world.dataset import build_world, world_text_tokenizer

__all__ = ["build_world", "world_text_tokenizer"]
