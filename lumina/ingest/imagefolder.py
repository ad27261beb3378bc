"""`lumina-data build --imagefolder DIR --tasks t2i,caption`: a folder of captioned images -> train / val shards.

DIR holds the images and `metadata.jsonl` (Hugging Face imagefolder): per image a JSON object with `file_name`
(relative to DIR) and `text` (its caption); other keys are unused and counted in the build report. Each image
becomes one sample per task, named "<file_name>#<task>", opened by the official system prompt of its task:
    t2i      user: the caption                          assistant: the image
    caption  user: the image, then the caption prompt   assistant: the caption
"val" takes round(val_fraction * N) of the N images (at least one when val_fraction > 0 and N >= 2), those
whose sha256(f"{seed}:{file_name}") sorts first; the rest is "train". A folder with train/ and a held-out
subfolder (`lumina.data.roots`) keeps those splits; train/ beside a top-level metadata.jsonl is refused.
A bad metadata line or image is a bad row named by `metadata.jsonl` and its line number.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lumina.contract.system_prompts import OFFICIAL_SYSTEM_PROMPTS
from lumina.contract.tasks import CAPTION, T2I
from lumina.contract.tasks import TASKS as TASKS_TABLE
from lumina.data.roots import dataset_root
from lumina.ingest.build_shards import RawRow, manifest_rows

METADATA_FILE = "metadata.jsonl"
FOLDER_TASKS = (T2I, CAPTION)
TASKS = tuple(task.name for task in FOLDER_TASKS)
SPLITS = ("train", "val")
CAPTION_PROMPT = "describe the image ."
ENTRY_KEYS = ("file_name", "text")  # what a metadata line gives a sample


def _check_entry(row: RawRow) -> RawRow:
    """A metadata row with a valid {"file_name", "text"}, or the row marked with why it is not one."""
    if row.error is not None:
        return row
    obj = row.obj
    if isinstance(obj, dict):
        row = RawRow(row.file, row.line, obj, ignored_keys=tuple(k for k in obj if k not in ENTRY_KEYS))
    for key in ENTRY_KEYS:
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str) or not obj[key].strip():
            value = obj.get(key) if isinstance(obj, dict) else obj
            return RawRow(row.file, row.line, error=f"{key}={value!r}: a metadata line needs a non-empty string "
                                                      f"{key!r}")
    return row


def metadata_rows(directory: str | Path) -> list[RawRow]:
    """The lines of DIR/metadata.jsonl, each checked to hold a file_name and a text."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"imagefolder {directory}: no {METADATA_FILE} (lines of "
                                '{"file_name": "...", "text": "..."})')
    return [_check_entry(row) for row in manifest_rows([path])]


def caption_words(rows: list[RawRow], caption_prompt: str = CAPTION_PROMPT) -> list[str]:
    """The sorted words of the captions, the caption prompt and the system prompts (a vocabulary)."""
    words = set(caption_prompt.split())
    for task in FOLDER_TASKS:
        words.update(OFFICIAL_SYSTEM_PROMPTS[task.system_prompt].split())
    for row in rows:
        if row.error is None:
            words.update(row.obj["text"].split())
    return sorted(words)


def val_files(rows: list[RawRow], val_fraction: float, seed: int) -> set[str]:
    """The file names of the held-out split (module docstring)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction}: must lie in [0, 1)")
    names = sorted({row.obj["file_name"] for row in rows if row.error is None})
    count = round(val_fraction * len(names))
    if val_fraction > 0 and len(names) >= 2:
        count = max(1, count)
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())
    return set(ranked[:count])


def task_sample(file_name: str, text: str, task: str, caption_prompt: str) -> dict[str, Any]:
    """One manifest row (`lumina.ingest.build_shards` schema) of an image and its caption."""
    image = {"kind": "image", "file": file_name}
    if task == T2I.name:
        turns = [{"role": "user", "parts": [{"kind": "text", "text": text}]},
                 {"role": "assistant", "parts": [image]}]
    elif task == CAPTION.name:
        turns = [{"role": "user", "parts": [image, {"kind": "text", "text": caption_prompt}]},
                 {"role": "assistant", "parts": [{"kind": "text", "text": text}]}]
    else:
        raise ValueError(f"task={task!r}: expected one of {TASKS}")
    prompt = OFFICIAL_SYSTEM_PROMPTS[TASKS_TABLE.get(task, "task").system_prompt]
    system = {"role": "system", "parts": [{"kind": "text", "text": prompt}]}
    return {"id": f"{file_name}#{task}", "turns": [system, *turns]}


def task_rows(rows: list[RawRow], tasks: list[str], caption_prompt: str = CAPTION_PROMPT) -> list[RawRow]:
    """Each metadata line -> one row per task, in order (bad lines pass through, for the build to report)."""
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise ValueError(f"tasks={tasks}: expected a non-empty list of {TASKS}")
    out: list[RawRow] = []
    for row in rows:
        if row.error is not None:
            out.append(row)
            continue
        out += [RawRow(row.file, row.line, task_sample(row.obj["file_name"], row.obj["text"], task, caption_prompt),
                       ignored_keys=row.ignored_keys if k == 0 else ())  # counted once per line
                for k, task in enumerate(tasks)]
    return out


def split_rows(rows: list[RawRow], tasks: list[str], val_fraction: float = 0.1, seed: int = 0,
               caption_prompt: str = CAPTION_PROMPT) -> dict[str, list[RawRow]]:
    """{"train": rows, "val": rows}: the held-out images' task rows in "val" (bad lines go to train)."""
    held_out = val_files(rows, val_fraction, seed)
    held = [row.error is None and row.obj["file_name"] in held_out for row in rows]
    return {"train": task_rows([r for r, h in zip(rows, held, strict=True) if not h], tasks, caption_prompt),
            "val": task_rows([r for r, h in zip(rows, held, strict=True) if h], tasks, caption_prompt)}


def folder_splits(directory: str | Path, tasks: list[str], val_fraction: float = 0.1, seed: int = 0,
                  caption_prompt: str = CAPTION_PROMPT) -> tuple[list[RawRow], dict[str, list[RawRow]]]:
    """(every metadata line, {"train", "val"} task rows) of an imagefolder (module docstring)."""
    root = dataset_root(directory)
    if root is not None and (Path(directory) / METADATA_FILE).is_file():
        raise ValueError(f"imagefolder {directory} holds both {root.train}/ and {Path(directory) / METADATA_FILE}; "
                         "keep the top-level images in train/ (or drop train/), so that none is left out")
    if root is None or root.val is None:
        rows = metadata_rows(directory if root is None else root.train)
        return rows, split_rows(rows, tasks, val_fraction, seed, caption_prompt)
    train, val = metadata_rows(root.train), metadata_rows(root.val)
    return train + val, {"train": task_rows(train, tasks, caption_prompt),
                         "val": task_rows(val, tasks, caption_prompt)}
