"""Generation-based evaluation on the built-in world's held-out split: does the trained model work? Scores,
each against its chance level: understand (caption + vqa) and text_qa: exact match of the decoded answer; t2i:
fraction of {colour, shape, size, position} the decoded image shows right (`score`) and all four right
(`exact`); edit: the same against the edited scene, plus `changed` (the edited attribute shows the new value).
Under data parallelism every rank generates its share of items; results are gathered to every rank.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from lumina.contract.tasks import CAPTION, EDIT, T2I, UNDERSTAND
from lumina.generation.assets import GenerationAssets
from lumina.generation.image import generate_images
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.sequences import Prompt
from lumina.generation.settings import image_config, text_config
from lumina.generation.sync import distributed, shard_indices
from lumina.generation.text import generate_text
from lumina.tokenizers.pixels import save_png
from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.text import WordTokenizer
from lumina.world.checker import classify_image
from lumina.world.dataset import build_world, cached_world_image_tokenizer
from lumina.world.scene import COLOURS, IMAGE_SIZE, POSITIONS, SHAPES, SIZES, ObjectSpec, render
from lumina.world.tasks import NUMBER_WORDS, SIDES, TASKS, TEXT_QA, VQA, WorldItem

ATTRIBUTES = ("colour", "shape", "size", "position")
VALUES = {"colour": tuple(COLOURS), "shape": SHAPES, "size": tuple(SIZES), "position": POSITIONS}
VQA_ATTRIBUTE = {"what colour is the shape ?": "colour", "what shape is it ?": "shape",
                 "is the shape small or large ?": "size", "where is the shape ?": "position"}
TEXT_TASKS = (CAPTION.name, VQA.name, TEXT_QA.name)
IMAGE_TASKS = (T2I.name, EDIT.name)


@dataclass(frozen=True)
class WorldEvalConfig:
    """num_items: items per task drawn from `split` (deterministic in split, num_items, seed)."""

    split: str = "val"
    num_items: int = 16
    seed: int = 0
    text: TextSamplingConfig = field(default_factory=lambda: TextSamplingConfig(
        gen_length=16, block_length=16, steps=8, temperature=0.0, batch_size=16))
    image: ImageSamplingConfig = field(default_factory=lambda: ImageSamplingConfig(
        steps=16, temperature=1.0, cfg_scale=2.0, batch_size=8))
    edit_image: ImageSamplingConfig = field(default_factory=lambda: ImageSamplingConfig(
        steps=16, temperature=1.0, cfg_scale=1.0, batch_size=8))

    def __post_init__(self) -> None:
        if self.num_items <= 0:
            raise ValueError(f"WorldEvalConfig.num_items={self.num_items}: must be positive")


@dataclass
class WorldEvalSet:
    items: dict[str, list[WorldItem]]
    prompts: dict[str, list[Prompt]]
    text_tokenizer: WordTokenizer
    image_tokenizer: RVQImageTokenizer
    tokens: object


@dataclass
class WorldEvalResult:
    """metrics: name -> value in [0, 1] (and the matching `chance/<name>`); answers: task -> decoded text or
    classified attributes per item; grid: a [3, H, W] image in [0, 1] of samples (truth | generated)."""

    metrics: dict[str, float]
    answers: dict[str, list]
    grid: torch.Tensor | None


def build_eval_set(config: WorldEvalConfig, image_tokenizer: RVQImageTokenizer | None = None) -> WorldEvalSet:
    image_tokenizer = image_tokenizer or cached_world_image_tokenizer()
    items, prompts = {}, {}
    for task in TASKS:
        world = build_world(config.split, config.num_items, config.seed, mix={task: 1.0},
                            image_tokenizer=image_tokenizer)
        tokens, text_tokenizer = world.tokens, world.text_tokenizer
        items[task] = world.items
        side = IMAGE_SIZE // image_tokenizer.patch_size
        prompts[task] = [Prompt.of_sample(world.dataset[i], (side, side) if item.target is not None else None)
                         for i, item in enumerate(world.items)]
    return WorldEvalSet(items, prompts, text_tokenizer, image_tokenizer, tokens)


@torch.no_grad()
def evaluate_world(model: nn.Module, eval_set: WorldEvalSet, config: WorldEvalConfig,
                   grid_samples: int = 6) -> WorldEvalResult:
    """Generate every task's answers (this rank's share), gather them, and score them."""
    tokens = eval_set.tokens
    answers: dict[str, list] = {}
    for task in TEXT_TASKS:
        answers[task] = _sharded(eval_set.prompts[task], lambda ps: [
            decode_text(a.ids, eval_set.text_tokenizer) for a in generate_text(model, ps, tokens, config.text)])
    images: dict[str, list[torch.Tensor]] = {}
    for task, sampling in zip(IMAGE_TASKS, (config.image, config.edit_image), strict=True):
        images[task] = _sharded(eval_set.prompts[task], lambda ps, s=sampling: [
            eval_set.image_tokenizer.decode(a.codes, *a.grid)[0] for a in generate_images(model, ps, tokens, s)])
        answers[task] = [classify_image(img) for img in images[task]]
    metrics = score(eval_set.items, answers)
    return WorldEvalResult(metrics, answers, sample_grid(eval_set.items, images, grid_samples))


def _sharded(prompts: list[Prompt], run) -> list:
    """run(this rank's prompts) -> their results; gathered back into the original order on every rank."""
    mine = shard_indices(len(prompts))
    local = list(zip(mine, run([prompts[i] for i in mine]), strict=True))
    if not distributed():
        return [r for _, r in local]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [(i, r.cpu() if isinstance(r, torch.Tensor) else r) for i, r in local])
    out: list = [None] * len(prompts)
    for part in gathered:
        for i, r in part:
            out[i] = r
    return out


def decode_text(ids: list[int], tokenizer: WordTokenizer) -> str:
    """Words of the answer; an id outside the world vocabulary reads as <oov> (never a right answer)."""
    words = [tokenizer.decode([i], skip_special_tokens=True) if 0 <= i < tokenizer.vocab_size else "<oov>"
             for i in ids]
    return " ".join(" ".join(words).split())


def score(items: dict[str, list[WorldItem]], answers: dict[str, list]) -> dict[str, float]:
    m: dict[str, float] = {}
    groups = {**{task: (task,) for task in TEXT_TASKS}, UNDERSTAND.name: (CAPTION.name, VQA.name)}
    for name, tasks in groups.items():
        pairs = [(a, item) for task in tasks for a, item in zip(answers[task], items[task], strict=True)]
        m[f"{name}_acc"] = _mean([float(a == item.answer) for a, item in pairs])
        m[f"chance/{name}_acc"] = _mean([answer_chance(item) for _, item in pairs])
    for task in IMAGE_TASKS:
        pairs = zip(answers[task], items[task], strict=True)
        fractions = [_attribute_fraction(found, item.target) for found, item in pairs]
        m[f"{task}_score"], m[f"{task}_exact"] = _mean(fractions), _mean([float(f == 1.0) for f in fractions])
        m[f"chance/{task}_score"] = _mean([1 / len(VALUES[a]) for a in ATTRIBUTES])
        m[f"chance/{task}_exact"] = 1 / math.prod(len(VALUES[a]) for a in ATTRIBUTES)
    changed = [_changed_attribute(item) for item in items[EDIT.name]]
    m[f"{EDIT.name}_changed"] = _mean([float(f is not None and f[a] == getattr(item.target, a))
                                       for f, a, item in zip(answers[EDIT.name], changed, items[EDIT.name],
                                                             strict=True)])
    m[f"chance/{EDIT.name}_changed"] = _mean([1 / len(VALUES[a]) for a in changed])
    return m


def answer_chance(item: WorldItem) -> float:
    """Probability that a uniform guess over the answer's value set is right."""
    q = item.prompt
    if item.task == CAPTION.name:
        return 1 / math.prod(len(VALUES[a]) for a in ATTRIBUTES)
    if item.task == VQA.name:
        attribute = VQA_ATTRIBUTE.get(q)
        return 1 / len(VALUES[attribute]) if attribute else 1 / 2  # the rest are yes / no questions
    if " plus " in q:
        return 1 / len(NUMBER_WORDS)
    if " make " in q:
        return 1 / len(COLOURS)
    return 1 / len(set(SIDES.values()))


def _changed_attribute(item: WorldItem) -> str:
    (name,) = [a for a in ATTRIBUTES if getattr(item.source, a) != getattr(item.target, a)]
    return name


def _attribute_fraction(found: dict[str, str] | None, target: ObjectSpec) -> float:
    return 0.0 if found is None else sum(found[a] == getattr(target, a) for a in ATTRIBUTES) / len(ATTRIBUTES)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def sample_grid(items: dict[str, list[WorldItem]], images: dict[str, list[torch.Tensor]], count: int,
                scale: int = 4) -> torch.Tensor | None:
    """[3, H, W] in [0, 1]: one row per sample, t2i rows (truth | generated), then edit rows (source | truth |
    generated); images upscaled `scale` times, 2 px gaps."""
    rows = []
    for task in IMAGE_TASKS:
        for item, generated in list(zip(items.get(task, []), images.get(task, []), strict=True))[:count]:
            first = render(item.source) if task == EDIT.name else torch.full((3, 32, 32), -1.0)
            rows.append([first, render(item.target), generated])
    if not rows:
        return None
    gap = 2
    side = 32 * scale
    canvas = torch.full((3, len(rows) * (side + gap), 3 * (side + gap)), 0.5)
    for r, cells in enumerate(rows):
        for c, image in enumerate(cells):
            up = torch.nn.functional.interpolate(((image + 1) / 2).clamp(0, 1)[None], scale_factor=scale,
                                                 mode="nearest")[0]
            canvas[:, r * (side + gap):r * (side + gap) + side, c * (side + gap):c * (side + gap) + side] = up
    return canvas


def run_world_eval(model: nn.Module, assets: GenerationAssets, cfg: DictConfig, settings: DictConfig,
                   out: Path) -> Path:
    """`lumina-generate task=eval` on a built-in-world checkpoint (the "world" evaluation): eval.split,
    eval.num_items, eval.seed; writes <out>/eval.json and <out>/samples.png and prints each metric."""
    if not isinstance(assets.image_tokenizer, RVQVisualTokenizer):
        raise ValueError("task=eval on the built-in world needs its image tokenizer (image_tokenizer=auto or "
                         f"builtin), not {assets.image_tokenizer!r}")
    node = cfg.eval
    config = WorldEvalConfig(split=node.split, num_items=int(node.num_items), seed=int(node.seed),
                             text=text_config(cfg, settings, UNDERSTAND.name),
                             image=image_config(cfg, settings, T2I.name),
                             edit_image=image_config(cfg, settings, EDIT.name))
    result = evaluate_world(model, build_eval_set(config, assets.image_tokenizer.rvq), config)
    (out / "eval.json").write_text(json.dumps({"metrics": result.metrics, "answers": result.answers},
                                              indent=1) + "\n")
    if result.grid is not None:
        save_png(result.grid, out / "samples.png")
    width = max(len(k) for k in result.metrics)
    for name, value in result.metrics.items():
        if not name.startswith("chance/"):
            print(f"{name:<{width}}  {value:.3f}   (chance {result.metrics.get('chance/' + name, float('nan')):.3f})")
    print(f"lumina-generate: eval on {config.split} ({config.num_items} items per task) -> {out}", flush=True)
    return out
