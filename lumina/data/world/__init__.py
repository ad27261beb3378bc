"""The built-in procedural scene world: scenes, the ground-truth checker, tasks and the dataset."""

from lumina.data.world.checker import check_image, classify_image
from lumina.data.world.dataset import (
           WorldData,
           build_world,
           cached_world_image_tokenizer,
           world_text_tokenizer,
)
from lumina.data.world.scene import SPLITS, ObjectSpec, render
from lumina.data.world.tasks import TASKS, WorldItem, make_items

__all__ = ["SPLITS", "TASKS", "ObjectSpec", "WorldData", "WorldItem", "build_world", "cached_world_image_tokenizer",
           "check_image", "classify_image", "make_items", "render", "world_text_tokenizer"]
