"""`lumina-generate task=eval eval.data=DIR`: evaluate a checkpoint on the held-out split of your own dataset.
DIR is held-out Parquet shards, or a dataset root (its val/ or validation/ split). Each single-exchange sample
is one item of the request task its structure names (`lumina.contract.tasks.request_task`): understand (text
answer, prompt with an image; understand_video / understand_mesh3d with those media), text (text answer,
text-only prompt), all scored by exact match (whitespace-normalised) and corpus BLEU (n_gram 4, smoothed);
t2i (image answer, text-only prompt) and edit (image answer, prompt with an image), drawn in the sample grid
(prompt, truth | generated). Longer samples are counted in "skipped". Up to `num_items` items per task are
drawn by a seeded permutation. `<task>/loss` is the held-out loss over all the task's samples, laid out as
validation does (`layout_eval` at noise `noise_t`, seed `noise_seed`), averaged by `HeldOutLoss`. Writes
<out>/eval.json ({"metrics", "answers", "skipped"}) and <out>/samples.png.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw
from torch import nn

from lumina.contract.schema import Media, Sample, Text
from lumina.contract.tasks import TASKS, task_of
from lumina.data.noise import NoiseConfig
from lumina.data.packing import collate_pack
from lumina.data.roots import dataset_root
from lumina.data.sources import LayoutSource
from lumina.data.storage import ParquetSampleDataset
from lumina.generation.assets import GenerationAssets
from lumina.generation.image import generate_images
from lumina.generation.sampling import model_schedule
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.sequences import Prompt
from lumina.generation.text import generate_text
from lumina.objective import LuminaObjective
from lumina.objective.held_out import HeldOutLoss
from lumina.tokenizers.pixels import to_uint8

LABEL_HEIGHT = 12  # px of prompt text above each grid row


@dataclass(frozen=True)
class OwnEvalConfig:
    data: str
    num_items: int = 16
    seed: int = 0
    noise_t: float = 0.5
    noise_seed: int = 1234
    text: TextSamplingConfig = field(default_factory=TextSamplingConfig)
    image: ImageSamplingConfig = field(default_factory=ImageSamplingConfig)

    def __post_init__(self) -> None:
        if self.num_items <= 0:
            raise ValueError(f"eval.num_items={self.num_items}: must be positive")


@dataclass
class OwnEvalResult:
    metrics: dict[str, float]
    answers: list[dict[str, Any]]
    skipped: int
    grid: Image.Image | None


def held_out_dataset(path: str | Path, assets: GenerationAssets) -> ParquetSampleDataset:
    """eval.data -> its held-out shards (a dataset root's val/), checked against the checkpoint's tokens."""
    root = dataset_root(path)
    if root is not None:
        if root.val is None:
            raise ValueError(f"eval.data={str(path)!r}: a dataset root without val/ or validation/")
        path = root.val
    return ParquetSampleDataset(path, tokens=assets.tokens)


def _prompt(sample: Sample, key: int) -> tuple[Prompt, Text | Media]:
    system = [i for t in sample.turns if t.role == "system" for p in t.parts if isinstance(p, Text) for i in p.ids]
    user, answer = [t for t in sample.turns if t.role != "system"]
    truth = answer.parts[0]
    grid = tuple(truth.grid) if isinstance(truth, Media) else None
    return Prompt(list(user.parts), system=system or None, key=key, grid=grid), truth


def _decode(assets: GenerationAssets, ids: list[int]) -> str:
    vocab = assets.text_tokenizer.vocab_size
    return " ".join(assets.text_tokenizer.decode([i for i in ids if 0 <= i < vocab], skip_special_tokens=True).split())


def held_out_loss(model: nn.Module, dataset: ParquetSampleDataset, indices: list[int], config: OwnEvalConfig
                  ) -> float:
    """`HeldOutLoss` of the samples `indices`, each laid out by `layout_eval` (module docstring)."""
    schedule = model_schedule(model)
    source = LayoutSource(dataset, NoiseConfig(schedule=model.config.masking_schedule), config.noise_seed,
                          eval_t=config.noise_t)
    objective = LuminaObjective(schedule=schedule).eval()
    device = next(model.parameters()).device
    held_out = HeldOutLoss(dataset.tokens.num_codebooks)
    with torch.no_grad():
        for i in indices:
            seq = source.sequence(i, 0)
            batch = collate_pack([seq], len(seq), dataset.tokens.pad, dataset.tokens.num_codebooks).to(device)
            held_out.add(objective(model(batch), batch))
    return held_out.scores()[0]


def evaluate_own(model: nn.Module, assets: GenerationAssets, config: OwnEvalConfig) -> OwnEvalResult:
    """Generate and score the held-out items of `config.data` (module docstring)."""
    from torchmetrics.text import BLEUScore

    dataset = held_out_dataset(config.data, assets)
    by_task: dict[str | None, list[int]] = {}
    for i in range(len(dataset)):
        by_task.setdefault(task_of(dataset[i]), []).append(i)
    skipped = len(by_task.pop(None, []))
    if not by_task:
        raise ValueError(f"eval.data={config.data!r}: no single-exchange samples to evaluate ({skipped} skipped)")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(config.seed)).tolist()
    rank = {index: r for r, index in enumerate(order)}
    metrics: dict[str, float] = {}
    answers: list[dict[str, Any]] = []
    rows: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for task, indices in sorted(by_task.items()):
        metrics[f"{task}/loss"] = held_out_loss(model, dataset, indices, config)
        chosen = sorted(indices, key=rank.__getitem__)[:config.num_items]
        prompts, truths = zip(*(_prompt(dataset[i], i) for i in chosen), strict=True)
        prompt_texts = [_decode(assets, [i for p in pr.parts if isinstance(p, Text) for i in p.ids]) for pr in prompts]
        if not TASKS.get(task, "task").image_answer:
            outputs = generate_text(model, list(prompts), assets.tokens, config.text)
            said = [_decode(assets, out.ids) for out in outputs]
            wanted = [_decode(assets, truth.ids) for truth in truths]
            metrics[f"{task}/exact_match"] = sum(s == w for s, w in zip(said, wanted, strict=True)) / len(said)
            metrics[f"{task}/bleu"] = float(BLEUScore(n_gram=4, smooth=True)(said, [[w] for w in wanted]))
            answers += [{"task": task, "id": dataset[i].id, "prompt": p, "answer": s, "truth": w}
                        for i, p, s, w in zip(chosen, prompt_texts, said, wanted, strict=True)]
        else:
            outputs = generate_images(model, list(prompts), assets.tokens, config.image)
            for i, p, truth, out in zip(chosen, prompt_texts, truths, outputs, strict=True):
                answers.append({"task": task, "id": dataset[i].id, "prompt": p, "grid": list(out.grid)})
                if assets.image_tokenizer is not None:
                    decode = assets.image_tokenizer.decode
                    rows.append((f"{task}: {p}", decode(truth.codes, truth.grid)[0], decode(out.codes, out.grid)[0]))
        metrics[f"{task}/items"] = float(len(chosen))
    return OwnEvalResult(metrics, answers, skipped, sample_grid(rows))


def sample_grid(rows: list[tuple[str, torch.Tensor, torch.Tensor]], gap: int = 2) -> Image.Image | None:
    """One row per item: its prompt written above truth | generated (pixels [3, H, W] in [-1, 1])."""
    if not rows:
        return None
    widths = [truth.shape[2] + gap + generated.shape[2] for _, truth, generated in rows]
    heights = [LABEL_HEIGHT + max(truth.shape[1], generated.shape[1]) + gap for _, truth, generated in rows]
    canvas = Image.new("RGB", (max(max(widths), 6 * max(len(label) for label, _, _ in rows)), sum(heights)),
                       "white")
    draw = ImageDraw.Draw(canvas)
    top = 0
    for (label, truth, generated), height in zip(rows, heights, strict=True):
        draw.text((0, top), label, fill="black")
        left = 0
        for image in (truth, generated):
            canvas.paste(Image.fromarray(to_uint8(image)), (left, top + LABEL_HEIGHT))
            left += image.shape[2] + gap
        top += height
    return canvas
