"""Score one own-data training run on its dataset's held-out split (the A/B figures of experiments/own_data.md).

    python experiments/own_data/ab_eval.py RUN_DIR DATA_DIR [--items 90] [--text-block 16] [--pics PICS --t2i 90
        --cfg 0 --temperature 1 --image-steps 96 --judge-steps 6000] [--device cpu]
prints one JSON line: per task the held-out loss, answer-token accuracy and the image-ignoring baseline
(`lumina.training.conditioning`), caption exact match over --items held-out pictures, prefix match (the answer starts with the true caption:
right, but not stopped), and the share of
distinct captions the model gave (1 / items when it says the same for every picture). With --pics (the
imagefolder DATA_DIR was built from, its metadata carrying "label") and --t2i N: N held-out captions drawn by
the model (`lumina.generation.image`, unguided unless --cfg), judged by `checker.py` fitted on the training
pictures only (--judge-steps batches; 568 is the judge of the first five sessions, 8 passes over 4.5k); its
accuracy on the real held-out pictures is reported beside (the judge's ceiling).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lumina.contract.tasks import task_of
from lumina.data.noise import NoiseConfig
from lumina.generation.assets import load_assets, load_model
from lumina.generation.image import generate_images
from lumina.generation.own_eval import _decode, _prompt, held_out_dataset
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.text import generate_text
from lumina.objective import LuminaObjective
from lumina.training.conditioning import conditioning_scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("data")
    parser.add_argument("--items", type=int, default=90)
    parser.add_argument("--pics", default=None)
    parser.add_argument("--t2i", type=int, default=0)
    parser.add_argument(
        "--text-block", type=int, default=16, help="caption decoding: tokens per block (and steps)"
    )
    parser.add_argument(
        "--cfg", type=float, default=0.0, help="T2I classifier-free guidance scale (0: unguided)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="T2I sampling temperature (0: argmax, no re-mask noise)",
    )
    parser.add_argument("--image-steps", type=int, default=96, help="T2I denoising steps")
    parser.add_argument(
        "--judge-steps", type=int, default=None, help="the judge's fitting batches (checker.STEPS)"
    )
    parser.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)  # 5000-step weights hold denormals: CPU sampling 2.4x slower without
    model = load_model(f"{args.run}/hf", device=args.device)
    assets = load_assets(f"{args.run}/hf", "auto", model.config)
    dataset = held_out_dataset(args.data, assets)
    samples = [dataset[i] for i in range(len(dataset))]
    out = conditioning_scores(
        model,
        LuminaObjective().to(args.device).eval(),
        samples,
        dataset.tokens,
        model.config.num_codebooks,
        NoiseConfig(),
        1234,
        0.5,
        args.items,
        2048,
    )
    chosen = [s for s in samples if task_of(s) == "understand"][: args.items]
    prompts, truths = zip(*(_prompt(s, i) for i, s in enumerate(chosen)), strict=True)
    said = [
        _decode(assets, o.ids)
        for o in generate_text(
            model,
            list(prompts),
            assets.tokens,
            TextSamplingConfig(gen_length=16, block_length=args.text_block, steps=args.text_block),
        )
    ]
    wanted = [_decode(assets, t.ids) for t in truths]
    out["caption/exact_match"] = sum(s == w for s, w in zip(said, wanted, strict=True)) / len(said)
    out["caption/prefix_match"] = sum(
        s.split()[: len(w.split())] == w.split() for s, w in zip(said, wanted, strict=True)
    ) / len(said)
    out["caption/distinct"] = len(Counter(said)) / len(said)
    out["caption/chance"] = max(Counter(wanted).values()) / len(wanted)
    if args.pics and args.t2i:
        sampling = ImageSamplingConfig(
            cfg_scale=args.cfg, temperature=args.temperature, steps=args.image_steps
        )
        out.update(judge_t2i(model, assets, samples, Path(args.pics), args.t2i, sampling, args.judge_steps))
    print(json.dumps({k: round(v, 4) for k, v in out.items()}))


def judge_t2i(
    model,
    assets,
    samples,
    pics: Path,
    count: int,
    sampling: ImageSamplingConfig,
    judge_steps: int | None = None,
) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).parent))
    import checker

    judge_steps = judge_steps or checker.STEPS
    meta = {
        m["file_name"]: m["label"]
        for m in map(json.loads, (pics / "metadata.jsonl").read_text().splitlines())
    }
    held = [s for s in samples if task_of(s) == "t2i"][:count]
    held_files = {s.id.rsplit("#", 1)[0] for s in samples}

    def grey(name: str) -> np.ndarray:
        return np.asarray(Image.open(pics / name).convert("L"), dtype=np.float32)

    train = [n for n in meta if n not in held_files]
    cached = Path(f"{pics}.checker-{judge_steps}.pt")  # depends on the pictures and the split: fitted once
    judge = checker.classifier(int(max(meta.values())) + 1)
    if cached.is_file():
        judge.load_state_dict(torch.load(cached))
        judge.eval()
    else:
        judge = checker.fit(
            torch.tensor(np.stack([grey(n) for n in train])),
            torch.tensor([meta[n] for n in train]),
            steps=judge_steps,
        )
        torch.save(judge.state_dict(), cached)
    files = [s.id.rsplit("#", 1)[0] for s in held]
    labels = torch.tensor([meta[f] for f in files])
    real = checker.predict(judge, torch.tensor(np.stack([grey(f) for f in files])))
    prompts = [_prompt(s, i)[0] for i, s in enumerate(held)]
    images = generate_images(
        model,
        prompts,
        assets.tokens,
        sampling,
    )
    drawn = torch.stack([assets.image_tokenizer.decode(o.codes, o.grid)[0].mean(0) for o in images])
    made = checker.predict(judge, (drawn.clamp(-1, 1) + 1) * 127.5)
    return {
        "t2i/judged_correct": float((made == labels).float().mean()),
        "t2i/judge_on_real": float((real == labels).float().mean()),
        "t2i/chance": float(torch.bincount(labels).max()) / len(labels),
    }


if __name__ == "__main__":
    main()
