"""`run(cfg)`: what `lumina-generate` does with a composed `conf/generate.yaml`.

task=t2i | edit   -> <out>/images.png (a grid) + image_<i>.png when a visual tokenizer decodes the codes (the
                     built-in world's, or the checkpoint's visual_tokenizer/ from its training data), else
                     code_<i>.pt token files {"indices": [N, C], "coords": [N, 5]}; the answer is height x
                     width px (multiples of the patch) or grid cells (default: an edit's source size, else the
                     tokenizer's image size square, as infer_t2i_sft.py's resolve_output_image_size);
                     <out>/answers.jsonl lists every prompt and its file
Image inputs (understand, edit) are prepared as infer_mmu_sft.py's prepare_image_for_encode does:
input_max_edge (0: keep the size) and input_no_upscale, then a centre crop to multiples of the patch.
task=understand | text -> <out>/answers.jsonl ({"prompt", "image", "answer", "finished"} per line)
task=eval          -> <out>/eval.json + <out>/samples.png: with eval.data=DIR your own held-out split
                     (`lumina.generation.own_eval`: exact match, BLEU, a t2i grid, per-task loss), else the
                     built-in world evaluation
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lumina.data.fs import is_file
from lumina.data.pixels import Preparation, read_image, to_signed
from lumina.data.schema import Media, Part, Text
from lumina.data.token_files import read_token_file, token_file_dict
from lumina.data.tokenizers.atoken import PATCH as ATOKEN_PATCH
from lumina.data.tokenizers.rvq_visual import RVQVisualTokenizer
from lumina.generation.assets import GenerationAssets, load_assets, load_model
from lumina.generation.config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.image import generate_images
from lumina.generation.own_eval import OwnEvalConfig, evaluate_own
from lumina.generation.sequences import Prompt
from lumina.generation.text import generate_text
from lumina.generation.world_eval import WorldEvalConfig, build_eval_set, evaluate_world, save_png

DEFAULT_GRID = (8, 8)  # t2i without a visual tokenizer: the built-in world's 32 x 32 px images in 4 px patches
TASKS = ("t2i", "edit", "understand", "text", "eval")
TOKEN_SUFFIXES = (".pkl", ".pt")  # official token files; any other file is read as an image


def run(cfg: DictConfig) -> Path:
    task = cfg.task
    if task not in TASKS:
        raise ValueError(f"task={task!r}: expected one of {TASKS}")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = _device(cfg.device)
    model = load_model(cfg.checkpoint, device=device, dtype=cfg.dtype)
    assets = load_assets(cfg.checkpoint, cfg.tokenizer, model.config, str(cfg.get("image_tokenizer", "auto")),
                         cfg.device)  # as given: AToken refuses to leave CUDA unless a device is named
    text_cfg = TextSamplingConfig(**_plain(cfg.text))
    image_cfg = ImageSamplingConfig(**_plain(cfg.image))
    if task == "eval":
        return _run_eval(model, assets, cfg, text_cfg, image_cfg, out)
    requests = read_prompts(cfg)
    needs_image = task in ("edit",)
    prompts = [_prompt(i, r, assets, cfg, needs_image, task in ("t2i", "edit")) for i, r in enumerate(requests)]
    lines = []
    if task in ("understand", "text"):
        for r, answer in zip(requests, generate_text(model, prompts, assets.tokens, text_cfg), strict=True):
            lines.append({**r, "answer": _decode(assets, answer.ids), "finished": answer.finished,
                          "ids": answer.ids})
    else:
        answers = generate_images(model, prompts, assets.tokens, image_cfg)
        pictures = []
        for i, (r, answer) in enumerate(zip(requests, answers, strict=True)):
            if assets.image_tokenizer is not None:
                picture = assets.image_tokenizer.decode(answer.codes, answer.grid)[0]
                pictures.append(picture)
                path = out / f"image_{i}.png"
                save_png((picture + 1) / 2, path)
            else:
                path = out / f"code_{i}.pt"
                torch.save(token_file_dict(answer.codes, answer.grid), path)
            lines.append({**r, "file": path.name, "grid": list(answer.grid)})
        if pictures and len({p.shape for p in pictures}) == 1:
            save_png(_row((torch.stack(pictures) + 1) / 2), out / "images.png")
    answers_path = out / "answers.jsonl"
    answers_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"lumina-generate: {task} on {len(lines)} prompt(s) -> {out}", flush=True)
    return out


def _run_eval(model, assets: GenerationAssets, cfg: DictConfig, text_cfg: TextSamplingConfig,
              image_cfg: ImageSamplingConfig, out: Path) -> Path:
    node = cfg.eval
    if node.get("data"):
        return _run_own_eval(model, assets, node, text_cfg, image_cfg, out)
    if assets.name != "world" or not isinstance(assets.image_tokenizer, RVQVisualTokenizer):
        raise ValueError(f"task=eval without eval.data runs on the built-in world and its image tokenizer; the "
                         f"checkpoint uses tokenizer {assets.name!r} (set eval.data=DIR to evaluate on your data)")
    edit_cfg = ImageSamplingConfig(**{**asdict(image_cfg), "cfg_scale": float(node.edit_cfg_scale)})
    config = WorldEvalConfig(split=node.split, num_items=int(node.num_items), seed=int(node.seed),
                             text=text_cfg, image=image_cfg, edit_image=edit_cfg)
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
                record = json.loads(line)
                if "prompt" not in record:
                    raise ValueError(f"{path}:{n}: a JSON line needs a 'prompt' key")
                requests.append({"prompt": str(record["prompt"]), "image": record.get("image")})
            else:
                requests.append({"prompt": line.strip(), "image": None})
    if not requests:
        raise ValueError("no prompts: set prompts=[...] or prompts_file=PATH")
    return requests


def _prompt(index: int, request: dict[str, Any], assets: GenerationAssets, cfg: DictConfig, needs_image: bool,
            image_answer: bool) -> Prompt:
    parts: list[Part] = []
    grid = None
    if request.get("image") is not None:
        media = load_image(request["image"], assets, cfg.get("input_max_edge", 0),
                           cfg.get("input_no_upscale", False))
        parts.append(media)
        grid = tuple(media.grid)
    elif needs_image:
        raise ValueError(f"prompt {index} ({request['prompt']!r}): task=edit needs an image (images=[...] or "
                         "an 'image' key in prompts_file)")
    parts.append(Text(assets.text_tokenizer.encode(request["prompt"])))
    if image_answer:
        grid = answer_grid(cfg, assets, grid)
    system = assets.text_tokenizer.encode(cfg.system) if cfg.get("system") else None
    return Prompt(parts, system=system, key=index, grid=grid if image_answer else None)


def answer_grid(cfg: DictConfig, assets: GenerationAssets, source: tuple[int, int] | None) -> tuple[int, int]:
    """The answer's (h, w) cells: cfg.height x cfg.width px (both, multiples of the patch), else cfg.grid, else
    the edit source's grid, else the visual tokenizer's image size square (DEFAULT_GRID without one)."""
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
    if tokenizer is None:
        return DEFAULT_GRID
    return tokenizer.image_size // patch, tokenizer.image_size // patch


def load_image(path: str, assets: GenerationAssets, max_edge: int = 0, no_upscale: bool = False) -> Media:
    """An official token file (.pkl / .pt, read by `lumina.data.token_files`) or, with a visual tokenizer, an
    image file read like the training data was (`lumina.data.pixels`) and encoded -> Media. `path` may be a URL
    (`lumina.data.fs`)."""
    if not is_file(path):
        raise FileNotFoundError(f"image {path!r}: no such file")
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


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
