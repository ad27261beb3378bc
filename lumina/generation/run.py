"""`run(cfg)`: what `lumina-generate` does with a composed `conf/generate.yaml`.

task=t2i | edit   -> <out>/images.png (a grid) + image_<i>.png when a visual tokenizer decodes the codes (the
                     built-in world's, or the checkpoint's visual_tokenizer/ from its training data), else
                     code_<i>.pt token files {"indices": [N, C], "coords": [N, 5]}; the answer is height x
                     width px (multiples of the patch) or grid cells (default: an edit's source size, else the
                     settings' grid, else the tokenizer's image size square, as infer_t2i_sft.py's
                     resolve_output_image_size); <out>/answers.jsonl lists every prompt and its file
Image inputs (understand, edit) are prepared as infer_mmu_sft.py's prepare_image_for_encode does:
input_max_edge (0: keep the size) and input_no_upscale, then a centre crop to multiples of the patch.
task=understand | text -> <out>/answers.jsonl ({"prompt", "image", "answer", "finished"} per line)
task=eval          -> <out>/eval.json + <out>/samples.png: with eval.data=DIR your own held-out split
                     (`lumina.generation.own_eval`: exact match, BLEU, a t2i grid, per-task loss), else the
                     evaluation a plug-in registered for the checkpoint's tokenizer set (the built-in world's)
Sampling settings, system prompts and dtype not given follow the checkpoint (`lumina.generation.settings`).
adapter_dir=DIR: a LoRA adapter in PEFT's format put on the checkpoint unmerged (`lumina.adapters.load_peft_adapter`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from lumina.adapters import load_peft_adapter
from lumina.contract.schema import Media, Part, Text
from lumina.contract.tasks import EDIT, T2I, TASKS, TEXT, UNDERSTAND, request_task
from lumina.files.fs import is_file
from lumina.generation.assets import GenerationAssets, load_assets, load_model, read_config
from lumina.generation.evaluations import EVALUATIONS
from lumina.generation.image import generate_images
from lumina.generation.own_eval import OwnEvalConfig, evaluate_own
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.sequences import Prompt
from lumina.generation.settings import (
    checkpoint_kind,
    default_grid,
    image_config,
    parameter_dtype,
    resolve_settings,
    system_prompt,
    text_config,
)
from lumina.generation.text import generate_text
from lumina.tokenizers.atoken import PATCH as ATOKEN_PATCH
from lumina.tokenizers.pixels import Preparation, read_image, save_png, to_signed
from lumina.tokenizers.text import PLACEHOLDER_STRINGS
from lumina.tokenizers.token_files import read_token_file, token_file_dict

DEFAULT_GRID = (8, 8)  # t2i without a visual tokenizer: the built-in world's 32 x 32 px images in 4 px patches
CLI_TASKS = (*(task.name for task in (T2I, EDIT, UNDERSTAND, TEXT)), "eval")
TOKEN_SUFFIXES = (".pkl", ".pt")  # official token files; any other file is read as an image


def run(cfg: DictConfig) -> Path:
    task = cfg.task
    if task not in CLI_TASKS:
        raise ValueError(f"task={task!r}: expected one of {CLI_TASKS}")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = _device(cfg.device)
    config = read_config(cfg.checkpoint)
    assets = load_assets(cfg.checkpoint, cfg.tokenizer, config, str(cfg.get("image_tokenizer", "auto")),
                         cfg.device)  # as given: AToken refuses to leave CUDA unless a device is named
    settings = resolve_settings(cfg, checkpoint_kind(config, assets.tokens, assets.text_tokenizer))
    model = load_model(cfg.checkpoint, device=device, dtype=parameter_dtype(cfg, settings, device))
    if cfg.get("adapter_dir"):  # a LoRA adapter in PEFT's format on top of the checkpoint, not merged
        load_peft_adapter(model, cfg.adapter_dir)
    if task == "eval":
        return _run_eval(model, assets, cfg, settings, out)
    requests = read_prompts(cfg)
    image_answer = TASKS.get(task, "task").image_answer
    prompts = [_prompt(i, r, assets, cfg, settings, task) for i, r in enumerate(requests)]
    lines: list[dict[str, Any] | None] = [None] * len(requests)
    pictures: dict[int, torch.Tensor] = {}
    for key, indices in _by_task(prompts, image_answer).items():
        group = [prompts[i] for i in indices]
        if not image_answer:
            for i, answer in zip(indices, generate_text(model, group, assets.tokens,
                                                        text_config(cfg, settings, key)), strict=True):
                lines[i] = {**requests[i], "answer": _decode(assets, answer.ids), "finished": answer.finished,
                            "ids": answer.ids}
            continue
        for i, answer in zip(indices, generate_images(model, group, assets.tokens,
                                                      image_config(cfg, settings, key)), strict=True):
            if assets.image_tokenizer is not None:
                pictures[i] = assets.image_tokenizer.decode(answer.codes, answer.grid)[0]
                path = out / f"image_{i}.png"
                save_png((pictures[i] + 1) / 2, path)
            else:
                path = out / f"code_{i}.pt"
                torch.save(token_file_dict(answer.codes, answer.grid), path)
            lines[i] = {**requests[i], "file": path.name, "grid": list(answer.grid)}
    if pictures and len({p.shape for p in pictures.values()}) == 1:
        save_png(_row((torch.stack([pictures[i] for i in sorted(pictures)]) + 1) / 2), out / "images.png")
    answers_path = out / "answers.jsonl"
    answers_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"lumina-generate: {task} on {len(lines)} prompt(s) -> {out}", flush=True)
    return out


def _by_task(prompts: list[Prompt], image_answer: bool) -> dict[str, list[int]]:
    """Prompt indices grouped by their settings task (t2i / edit, text / understanding of each media kind)."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(request_task(image_answer, [m.kind for m in p.media]).name, []).append(i)
    return groups


def _run_eval(model, assets: GenerationAssets, cfg: DictConfig, settings: DictConfig, out: Path) -> Path:
    node = cfg.eval
    if node.get("data"):
        return _run_own_eval(model, assets, node, text_config(cfg, settings, UNDERSTAND.name),
                             image_config(cfg, settings, T2I.name), out)
    evaluation = EVALUATIONS.find(assets.name)
    if evaluation is None:
        raise ValueError(f"task=eval without eval.data runs the evaluation of the checkpoint's tokenizer set "
                         f"({', '.join(EVALUATIONS.names())}); the checkpoint uses tokenizer {assets.name!r} (set "
                         "eval.data=DIR to evaluate on your data)")
    return evaluation(model, assets, cfg, settings, out)


def _run_own_eval(model, assets: GenerationAssets, node: DictConfig, text_cfg: TextSamplingConfig,
                  image_cfg: ImageSamplingConfig, out: Path) -> Path:
    config = OwnEvalConfig(data=str(node.data), num_items=int(node.num_items), seed=int(node.seed),
                           text=text_cfg, image=image_cfg)
    result = evaluate_own(model, assets, config)
    (out / "eval.json").write_text(json.dumps({"metrics": result.metrics, "answers": result.answers,
                                               "skipped": result.skipped}, indent=1) + "\n")
    if result.grid is not None:
        result.grid.save(out / "samples.png")
    for name, value in result.metrics.items():
        print(f"{name:<24}  {value:.4f}")
    print(f"lumina-generate: eval on {config.data} (up to {config.num_items} items per task, {result.skipped} "
          f"multi-exchange samples skipped) -> {out}", flush=True)
    return out


# ---- prompts ----
def read_prompts(cfg: DictConfig) -> list[dict[str, Any]]:
    """cfg.prompts (inline strings) + cfg.prompts_file (lines of text, or JSONL objects {"prompt", "image"});
    cfg.images gives inline prompts their images, in order."""
    requests: list[dict[str, Any]] = []
    images = list(cfg.get("images") or [])
    for i, text in enumerate(cfg.get("prompts") or []):
        requests.append({"prompt": str(text), "image": images[i] if i < len(images) else None})
    if len(images) > len(cfg.get("prompts") or []):
        raise ValueError(f"images has {len(images)} entries for {len(cfg.get('prompts') or [])} inline prompts")
    if cfg.get("prompts_file"):
        path = Path(cfg.prompts_file)
        if not path.is_file():
            raise FileNotFoundError(f"prompts_file={str(path)!r}: no such file")
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"prompts_file={str(path)!r}, line {n}: not valid JSON ({error})") from error
                if not isinstance(record, dict) or "prompt" not in record:
                    raise ValueError(f"prompts_file={str(path)!r}, line {n}: a JSON line needs a 'prompt' key")
                requests.append({"prompt": str(record["prompt"]), "image": record.get("image")})
            else:
                requests.append({"prompt": line.strip(), "image": None})
    if not requests:
        raise ValueError("no prompts: set prompts=[...] or prompts_file=PATH")
    return requests


def _prompt(index: int, request: dict[str, Any], assets: GenerationAssets, cfg: DictConfig, settings: DictConfig,
            task: str) -> Prompt:
    """One request as the official scripts build it: the task's system prompt, and the user text with a
    placeholder line per media it does not place itself ("<IMG_CONTEXT>\\n{prompt}"), tokenised whole; the
    layout expands the placeholders (`lumina.data.layout_pieces.user_content`)."""
    media: list[Media] = []
    if request.get("image") is not None:
        media.append(load_image(request["image"], assets, cfg.get("input_max_edge", 0),
                                cfg.get("input_no_upscale", False)))
    elif task == EDIT.name:
        raise ValueError(f"prompt {index} ({request['prompt']!r}): task=edit needs an image (images=[...] or "
                         "an 'image' key in prompts_file)")
    image_answer = TASKS.get(task, "task").image_answer
    key = request_task(image_answer, [m.kind for m in media]).name
    text, tokens = request["prompt"], assets.tokens
    if media and all(tokens.placeholder(m.kind) >= 0 for m in media):
        marks = [PLACEHOLDER_STRINGS[m.kind] for m in media]
        if not any(mark in text for mark in marks):
            text = "\n".join(marks + ([text] if text else []))
        parts: list[Part] = [Text(assets.text_tokenizer.encode(text)), *media]
    else:
        parts = [*media, Text(assets.text_tokenizer.encode(text))]
    grid = None
    if image_answer:
        grid = answer_grid(cfg, assets, tuple(media[0].grid) if media else None, default_grid(settings, key))
    system = assets.text_tokenizer.encode(system_prompt(cfg, settings, key))
    return Prompt(parts, system=system, key=index, grid=grid)


def answer_grid(cfg: DictConfig, assets: GenerationAssets, source: tuple[int, int] | None,
                default: tuple[int, int] | None) -> tuple[int, int]:
    """The answer's (h, w) cells: cfg.height x cfg.width px (both, multiples of the patch), else cfg.grid, else
    the edit source's grid, else the settings' grid (`default`), else the visual tokenizer's image size square
    (DEFAULT_GRID without one)."""
    tokenizer = assets.image_tokenizer
    patch = ATOKEN_PATCH if tokenizer is None else tokenizer.patch_size  # no tokenizer: the official model's
    height, width = cfg.get("height"), cfg.get("width")
    if height is not None or width is not None:
        for name, value in (("height", height), ("width", width)):
            if not isinstance(value, int) or value < patch or value % patch:
                raise ValueError(f"{name}={value!r}: the answer's height and width must both be given, as positive "
                                 f"multiples of the visual tokenizer's patch ({patch} px)")
        return height // patch, width // patch
    if cfg.get("grid"):
        return tuple(int(g) for g in cfg.grid)
    if source is not None:
        return source
    if default is not None:
        return default
    if tokenizer is None:
        return DEFAULT_GRID
    return tokenizer.image_size // patch, tokenizer.image_size // patch


def load_image(path: str, assets: GenerationAssets, max_edge: int = 0, no_upscale: bool = False) -> Media:
    """An official token file (.pkl / .pt, read by `lumina.tokenizers.token_files`) or, with a visual tokenizer, an
    image file read like the training data was (`lumina.tokenizers.pixels`) and encoded -> Media. `path` may be a URL
    (`lumina.files.fs`)."""
    if not is_file(path):  # a store that cannot be reached raises StoreError (an outage), naming the URL
        raise FileNotFoundError(f"image {path!r} does not exist")
    if Path(path).suffix in TOKEN_SUFFIXES:
        tokens = assets.tokens
        found = read_token_file(path, "image", tokens.num_codebooks, tokens.codebook_size)
        return Media("image", found.codes, found.grid)
    tokenizer = assets.image_tokenizer
    if tokenizer is None:
        raise ValueError(f"image {path!r}: pixels need a visual tokenizer (image_tokenizer=builtin|atoken|DIR); "
                         "or pass a token file (.pkl / .pt)")
    prep = Preparation(int(max_edge), tokenizer.patch_size, upscale=not no_upscale)
    codes, grid = tokenizer.encode(to_signed(read_image(path, prep)[None]))
    return Media("image", codes[0], tuple(grid))


def _decode(assets: GenerationAssets, ids: list[int]) -> str:
    vocab = assets.text_tokenizer.vocab_size
    return assets.text_tokenizer.decode([i for i in ids if 0 <= i < vocab], skip_special_tokens=True)


def _row(images: torch.Tensor, gap: int = 2) -> torch.Tensor:
    """[N, 3, H, W] -> [3, H, N * (W + gap)] side by side."""
    n, _, h, w = images.shape
    canvas = torch.full((3, h, n * (w + gap)), 0.5)
    for i in range(n):
        canvas[:, :, i * (w + gap):i * (w + gap) + w] = images[i]
    return canvas


DEVICES = "auto, cpu, cuda, cuda:N"


def _device(name: str) -> str:
    """The torch device of `device=` (auto: CUDA when there is one); a name outside DEVICES, or CUDA on a
    machine without it, raises ValueError naming the value."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", str(name)):
        raise ValueError(f"device={name!r}: expected one of {DEVICES}")
    if name != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}: no CUDA device is available here (device=cpu or device=auto)")
    return name
