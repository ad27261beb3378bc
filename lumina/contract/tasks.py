"""The task table: every task a sample, a request or an evaluation names, once. A row says what media the
prompt carries, what kind of answer is generated, and which system prompt opens it (the key into a prompt set
of `lumina.contract.system_prompts`). The generic rows are lumina's own (the official request kinds and the
image-folder caption); a plug-in registers its own rows with `register_task` (the built-in world: vqa, text_qa).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lumina.contract.schema import GRID_RANK, Media, Sample
from lumina.plugins import PluginRegistry

ANSWERS = ("text", "image")


@dataclass(frozen=True)
class Task:
    """name; media: the kind of media in the prompt (None: text only); answer: "text" or "image";
    system_prompt: the key of its system prompt in a prompt set."""

    name: str
    media: str | None
    answer: str
    system_prompt: str

    def __post_init__(self) -> None:
        if self.answer not in ANSWERS or (self.media is not None and self.media not in GRID_RANK):
            raise ValueError(f"task {self.name!r}: answer={self.answer!r} (one of {ANSWERS}), media={self.media!r} "
                             f"(None or one of {tuple(GRID_RANK)})")

    @property
    def image_answer(self) -> bool:
        return self.answer == "image"


TASKS: PluginRegistry[Task] = PluginRegistry("task")


def register_task(task: Task) -> Task:
    """Add a row to the table (a plug-in's own tasks)."""
    return TASKS.add(task.name, task)


def _generic(name: str, media: str | None, answer: str, system_prompt: str | None = None) -> Task:
    return register_task(Task(name, media, answer, system_prompt or name))


# the official request kinds (one system prompt each, infer_*_sft.py)
TEXT = _generic("text", None, "text")
UNDERSTAND = _generic("understand", "image", "text")
UNDERSTAND_VIDEO = _generic("understand_video", "video", "text")
UNDERSTAND_MESH3D = _generic("understand_mesh3d", "mesh3d", "text")
T2I = _generic("t2i", None, "image")
EDIT = _generic("edit", "image", "image")
REQUESTS = (TEXT, UNDERSTAND, UNDERSTAND_VIDEO, UNDERSTAND_MESH3D, T2I, EDIT)
# an image described in words (image folders, the built-in world)
CAPTION = _generic("caption", "image", "text", UNDERSTAND.system_prompt)


def request_task(image_answer: bool, media_kinds: Sequence[str]) -> Task:
    """The request kind of a prompt: an image answer is an edit with a source image, else text-to-image; a
    text answer is the understanding task of its first media kind, else text."""
    if image_answer:
        return EDIT if media_kinds else T2I
    media = media_kinds[0] if media_kinds else None
    (task,) = [t for t in REQUESTS if not t.image_answer and t.media == media]
    return task


def task_of(sample: Sample) -> str | None:
    """The request task a single-exchange sample's structure names (`request_task` of its answer kind and its
    prompt's media), None for a sample of more than one exchange."""
    turns = [t for t in sample.turns if t.role != "system"]
    if [t.role for t in turns] != ["user", "assistant"]:
        return None
    media = [p.kind for p in turns[0].parts if isinstance(p, Media)]
    return request_task(any(isinstance(p, Media) for p in turns[1].parts), media).name
