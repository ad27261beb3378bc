"""The world's tasks as plain records (`WorldItem`): texts and scene specs, before any tokenisation.

Tasks: caption (image -> caption), vqa (image + question -> answer), t2i (caption -> image), edit (image +
instruction -> image with one attribute changed), text_qa (addition, colour mixing, sides). Items only use
scene combinations and text questions of their split.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from lumina.contract.tasks import CAPTION, EDIT, T2I, TEXT, UNDERSTAND, Task, register_task
from lumina.world.scene import (
    COLOURS,
    JITTER,
    POSITIONS,
    SHAPES,
    SIZES,
    SPLITS,
    ObjectSpec,
    combinations_in,
    random_spec,
)

# the world's rows of the task table (caption, t2i and edit are generic rows)
VQA = register_task(Task("vqa", "image", "text", UNDERSTAND.system_prompt))
TEXT_QA = register_task(Task("text_qa", None, "text", TEXT.system_prompt))
WORLD_TASKS = (CAPTION, VQA, T2I, EDIT, TEXT_QA)
TASKS = tuple(task.name for task in WORLD_TASKS)
DEFAULT_TASK_MIX = dict(zip(TASKS, (0.2, 0.3, 0.2, 0.2, 0.1), strict=True))
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")
SIDES = {"circle": "zero", "triangle": "three", "square": "four"}
CAPTION_PROMPT = "describe the image ."
# The world's own short system prompts (lumina.contract.system_prompts keys), one per kind of task like the official ones
WORLD_SYSTEM_PROMPTS = {TEXT.system_prompt: "answer the question .", UNDERSTAND.system_prompt: "answer about the image .",
                        T2I.system_prompt: "draw the image .", EDIT.system_prompt: "edit the image ."}
_TEXT_QA_SPLIT_SEED = 20260102


@dataclass(frozen=True)
class WorldItem:
    """One task instance. `source` is the image in the prompt, `target` the image answer (or None)."""

    id: str
    task: str
    prompt: str
    answer: str | None = None
    source: ObjectSpec | None = None
    target: ObjectSpec | None = None


def caption(spec: ObjectSpec) -> str:
    return f"a {spec.size} {spec.colour} {spec.shape} at the {spec.position}"


def questions(spec: ObjectSpec) -> list[tuple[str, str]]:
    """(question, answer) pairs about one scene."""
    other = sorted(COLOURS)[(sorted(COLOURS).index(spec.colour) + 1) % len(COLOURS)]
    return [
        ("what colour is the shape ?", spec.colour),
        ("what shape is it ?", spec.shape),
        ("is the shape small or large ?", spec.size),
        ("where is the shape ?", spec.position),
        (f"is the shape {spec.colour} ?", "yes"),
        (f"is the shape {other} ?", "no"),
    ]


def edit_instruction(source: ObjectSpec, target: ObjectSpec) -> str:
    changed = [name for name in ("shape", "colour", "size", "position") if getattr(source, name) != getattr(target, name)]
    if len(changed) != 1:
        raise ValueError(f"an edit changes exactly one attribute; {source} -> {target} changes {changed}")
    name = changed[0]
    if name == "shape":
        return f"turn the shape into a {target.shape} ."
    if name == "position":
        return f"move the shape to the {target.position} ."
    return f"make the shape {getattr(target, name)} ."


def _mix(a: str, b: str) -> str:
    rgb = tuple(max(x, y) for x, y in zip(COLOURS[a], COLOURS[b], strict=True))
    return next(name for name, value in COLOURS.items() if value == rgb)


def all_text_qa() -> list[tuple[str, str]]:
    """Every text-only (question, answer) pair of the world."""
    items = [(f"what is {NUMBER_WORDS[a]} plus {NUMBER_WORDS[b]} ?", NUMBER_WORDS[a + b])
             for a in range(10) for b in range(10)]
    names = sorted(COLOURS)
    items += [(f"what colour do {a} and {b} make ?", _mix(a, b)) for i, a in enumerate(names) for b in names[i + 1:]]
    items += [(f"how many sides does a {shape} have ?", SIDES[shape]) for shape in SHAPES]
    return items


def _text_qa_split() -> dict[str, list[tuple[str, str]]]:
    items = all_text_qa()
    random.Random(_TEXT_QA_SPLIT_SEED).shuffle(items)
    n = len(items) // 10
    return {"test": items[:n], "val": items[n:2 * n], "train": items[2 * n:]}


TEXT_QA_BY_SPLIT = _text_qa_split()


@functools.cache
def edit_pairs(split: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """(source, target) combinations of `split` that differ in exactly one attribute."""
    combos = combinations_in(split)
    inside = set(combos)
    pairs = []
    for src in combos:
        for slot, values in enumerate((SHAPES, tuple(COLOURS), tuple(SIZES), POSITIONS)):
            for value in values:
                tgt = src[:slot] + (value,) + src[slot + 1:]
                if value != src[slot] and tgt in inside:
                    pairs.append((src, tgt))
    return tuple(pairs)


def task_counts(num_items: int, mix: dict[str, float]) -> dict[str, int]:
    """Exact per-task counts summing to num_items (largest remainder, ties broken by TASKS order)."""
    unknown = set(mix) - set(TASKS)
    if unknown:
        raise ValueError(f"task mix has unknown tasks {sorted(unknown)}; expected a subset of {TASKS}")
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"task mix weights must be >= 0 with a positive sum, got {mix}")
    total = sum(mix.values())
    quotas = {t: num_items * mix.get(t, 0.0) / total for t in TASKS}
    counts = {t: int(q) for t, q in quotas.items()}
    order = sorted(TASKS, key=lambda t: (-(quotas[t] - counts[t]), TASKS.index(t)))
    for t in order[: num_items - sum(counts.values())]:
        counts[t] += 1
    return {t: c for t, c in counts.items() if mix.get(t, 0.0) > 0}


def make_items(split: str, num_items: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[WorldItem]:
    """`num_items` task records of `split`, deterministic in (split, num_items, seed, mix)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    if not isinstance(num_items, int) or isinstance(num_items, bool) or num_items < 0:
        raise ValueError(f"num_items={num_items!r}: must be an integer >= 0")
    counts = task_counts(num_items, DEFAULT_TASK_MIX if mix is None else mix)
    rng = random.Random(f"lumina-world/{split}/{seed}")
    pairs = edit_pairs(split) if counts.get(EDIT.name) else []
    tasks = [t for t in TASKS for _ in range(counts.get(t, 0))]
    rng.shuffle(tasks)
    items = []
    for i, task in enumerate(tasks):
        item_id = f"world-{split}-s{seed}-{i:06d}-{task}"
        if task == CAPTION.name:
            spec = random_spec(rng, split)
            items.append(WorldItem(item_id, task, CAPTION_PROMPT, caption(spec), source=spec))
        elif task == VQA.name:
            spec = random_spec(rng, split)
            question, answer = rng.choice(questions(spec))
            items.append(WorldItem(item_id, task, question, answer, source=spec))
        elif task == T2I.name:
            spec = random_spec(rng, split)
            items.append(WorldItem(item_id, task, f"draw {caption(spec)} .", target=spec))
        elif task == EDIT.name:
            src_combo, tgt_combo = rng.choice(pairs)
            dx, dy = rng.randint(-JITTER, JITTER), rng.randint(-JITTER, JITTER)
            src = ObjectSpec(*src_combo, dx=dx, dy=dy)
            tgt = ObjectSpec(*tgt_combo, dx=dx, dy=dy)
            if src.position != tgt.position:
                tgt = tgt.with_(dx=rng.randint(-JITTER, JITTER), dy=rng.randint(-JITTER, JITTER))
            items.append(WorldItem(item_id, task, edit_instruction(src, tgt), source=src, target=tgt))
        else:
            question, answer = rng.choice(TEXT_QA_BY_SPLIT[split])
            items.append(WorldItem(item_id, task, question, answer))
    return items


def world_words() -> list[str]:
    """The world's closed vocabulary: every word any task text can contain, sorted."""
    texts = [CAPTION_PROMPT, *WORLD_SYSTEM_PROMPTS.values()]
    for split in SPLITS:
        for combo in combinations_in(split):
            spec = ObjectSpec(*combo)
            texts += [caption(spec), f"draw {caption(spec)} ."]
            texts += [t for pair in questions(spec) for t in pair]
    texts += [f"turn the shape into a {shape} ." for shape in SHAPES]
    texts += [f"move the shape to the {position} ." for position in POSITIONS]
    texts += [f"make the shape {value} ." for value in (*COLOURS, *SIZES)]
    texts += [t for pair in all_text_qa() for t in pair]
    return sorted({w for t in texts for w in t.split()})
