"""The built-in dataset: world task records -> tokenised `Sample`s (text ids + RVQ image codes).

    world = build_world("train", num_samples=2000, seed=0)
    world.dataset[i]        # Sample (the SampleDataset interface, with laid-out lengths)
    world.items[i]          # its WorldItem: texts and the ground-truth specs of its images
    world.tokens            # the SpecialTokens of the built-in tokenizers (pad = 0, C = 4, K = 64 by default)

A sample is [system (`WORLD_SYSTEM_PROMPTS`), user, assistant]. The image tokenizer is fitted on the train
scenes and cached under `cache_dir` (default $LUMINA_CACHE or ~/.cache/lumina), named by its settings.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.tasks import TASKS
from lumina.data.dataset_assets import DatasetAssets, TextTokenizerRecord, file_digest
from lumina.data.storage import InMemorySampleDataset
from lumina.tokenizers.rvq_quantizer import DEFAULT_RVQ, RVQImageTokenizer, RVQSettings
from lumina.tokenizers.rvq_tokenizer import RVQVisualTokenizer
from lumina.tokenizers.text import WordTokenizer, special_tokens_of
from lumina.world.scene import IMAGE_SIZE, JITTER, ObjectSpec, combinations_in, render
from lumina.world.tasks import WORLD_SYSTEM_PROMPTS, WorldItem, make_items, world_words

WORLD_VERSION = 1  # bump when rendering changes, so cached tokenizers are refitted
SOURCE = "world"


def default_cache_dir() -> Path:
    return Path(os.environ.get("LUMINA_CACHE", "~/.cache/lumina")).expanduser()


def world_text_tokenizer() -> WordTokenizer:
    return WordTokenizer(world_words())


def world_assets(cache_dir: str | Path | None = None) -> DatasetAssets:
    """The world's text tokenizer saved as a tokenizer.json in the cache (the assets an HF export copies)."""
    tokenizer = world_text_tokenizer()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = hashlib.sha256("\n".join(tokenizer.vocab).encode()).hexdigest()[:12]
    path = cache / f"world-tokenizer-{digest}.json"
    if not path.is_file():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tokenizer.save(tmp)
        tmp.replace(path)
    return DatasetAssets(TextTokenizerRecord(str(path), file_digest(path)))


def train_scene_specs() -> list[ObjectSpec]:
    """Every train combination at every jitter (the image tokenizer's fitting set)."""
    shifts = range(-JITTER, JITTER + 1)
    return [ObjectSpec(*c, dx=dx, dy=dy) for c in combinations_in("train") for dx in shifts for dy in shifts]


def render_specs(specs: list[ObjectSpec]) -> torch.Tensor:
    """[B, 3, 32, 32] in [-1, 1]."""
    if not specs:
        return torch.zeros(0, 3, IMAGE_SIZE, IMAGE_SIZE)
    return torch.stack([render(s) for s in specs])


def fit_world_image_tokenizer(settings: RVQSettings = DEFAULT_RVQ, num_images: int | None = None) -> RVQImageTokenizer:
    """Fit on the train scenes (the first `num_images` of a seeded shuffle when given, for quick tests)."""
    specs = train_scene_specs()
    if num_images is not None:
        order = torch.randperm(len(specs), generator=torch.Generator().manual_seed(settings.seed)).tolist()
        specs = [specs[i] for i in order[:num_images]]
    return RVQImageTokenizer.fit(render_specs(specs), settings)


def cached_world_image_tokenizer(settings: RVQSettings = DEFAULT_RVQ,
                                 cache_dir: str | Path | None = None) -> RVQImageTokenizer:
    """Load the fitted tokenizer for `settings` from the cache, fitting and saving it on a miss."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = "-".join(f"{k}{v}" for k, v in asdict(settings).items())
    path = cache / f"world-rvq-v{WORLD_VERSION}-{key}.safetensors"
    if path.is_file():
        tokenizer = RVQImageTokenizer.load(path)
        if tokenizer.settings != settings:
            raise ValueError(f"{path}: cached settings {tokenizer.settings} differ from {settings}")
        return tokenizer
    tokenizer = fit_world_image_tokenizer(settings)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tokenizer.save(tmp)
    tmp.replace(path)  # atomic: concurrent processes never read a half-written file
    return tokenizer


def world_visual_tokenizer() -> RVQVisualTokenizer:
    """The built-in world's `VisualTokenizer` ('builtin'): its cached residual VQ on 32 x 32 px scenes."""
    return RVQVisualTokenizer(cached_world_image_tokenizer(), IMAGE_SIZE,
                              {"fitted_on": "the built-in world's train scenes"})


def round_trip_report(tokenizer: RVQImageTokenizer, split: str = "val") -> dict[str, float]:
    """MSE ([-1, 1] units) and checker pass rate of decode(encode(x)) over every scene of `split`."""
    from lumina.world.checker import check_image

    shifts = range(-JITTER, JITTER + 1)
    specs = [ObjectSpec(*c, dx=dx, dy=dy) for c in combinations_in(split) for dx in shifts for dy in shifts]
    images = render_specs(specs)
    side = IMAGE_SIZE // tokenizer.patch_size
    recon = tokenizer.decode(tokenizer.encode(images), side, side)
    passed = sum(check_image(r, s) == 1.0 for r, s in zip(recon, specs, strict=True))
    return {"mse": float(((recon - images) ** 2).mean()), "pixel_variance": float(images.var()),
            "checker_pass_rate": passed / len(specs)}


def world_special_tokens(text_tokenizer: WordTokenizer, image_tokenizer: RVQImageTokenizer) -> SpecialTokens:
    return special_tokens_of(text_tokenizer, image_tokenizer.codebook_size, image_tokenizer.num_codebooks)


def items_to_samples(items: list[WorldItem], text_tokenizer: WordTokenizer,
                     image_tokenizer: RVQImageTokenizer) -> list[Sample]:
    """Tokenise records: images are rendered and encoded in one batch, grid (h, w) = 32 / patch_size."""
    specs = {s for item in items for s in (item.source, item.target) if s is not None}
    order = sorted(specs, key=lambda s: (s.combination, s.dx, s.dy))
    codes = image_tokenizer.encode(render_specs(order)) if order else torch.zeros(0, 0, 0, dtype=torch.long)
    side = IMAGE_SIZE // image_tokenizer.patch_size
    media = {s: Media("image", codes[i], (side, side)) for i, s in enumerate(order)}
    samples = []
    for item in items:
        user: list = [] if item.source is None else [media[item.source]]
        user.append(Text(text_tokenizer.encode(item.prompt)))
        answer = [media[item.target]] if item.target is not None else [Text(text_tokenizer.encode(item.answer or ""))]
        prompt = WORLD_SYSTEM_PROMPTS[TASKS.get(item.task, "item.task").system_prompt]
        system = Turn("system", [Text(text_tokenizer.encode(prompt))])
        samples.append(Sample(item.id, [system, Turn("user", user), Turn("assistant", answer)], source=SOURCE))
    return samples


@dataclass
class WorldData:
    split: str
    items: list[WorldItem]
    dataset: InMemorySampleDataset
    text_tokenizer: WordTokenizer
    image_tokenizer: RVQImageTokenizer
    tokens: SpecialTokens = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.dataset.tokens


def build_world(split: str = "train", num_samples: int = 2000, seed: int = 0, mix: dict[str, float] | None = None,
                image_tokenizer: RVQImageTokenizer | None = None, rvq: RVQSettings = DEFAULT_RVQ,
                cache_dir: str | Path | None = None) -> WorldData:
    """The built-in dataset of one split, deterministic in (split, num_samples, seed, mix, tokenizer)."""
    text_tokenizer = world_text_tokenizer()
    image_tokenizer = image_tokenizer or cached_world_image_tokenizer(rvq, cache_dir)
    items = make_items(split, num_samples, seed, mix)
    tokens = world_special_tokens(text_tokenizer, image_tokenizer)
    dataset = InMemorySampleDataset(items_to_samples(items, text_tokenizer, image_tokenizer), tokens)
    return WorldData(split, items, dataset, text_tokenizer, image_tokenizer)
