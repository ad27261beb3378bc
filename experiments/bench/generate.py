"""Sampling with the key/value cache (`cache=true`) against the full forward (`cache=false`), in one process,
medians of interleaved runs, on the benchmark configuration with the official vocabulary and heads
(`SMALL_CONFIG`, random weights, fp32, temperature 0; the EOA logit is zeroed so every block is decoded).

    python experiments/bench/generate.py [--threads 1] [--repeats 5] [--cases understand,edit_none,...]

Cases (issue 43): understanding a 32 x 32-cell image, 256 answer tokens in blocks of 32, 32 steps; editing a
16 x 16 grid in 32 steps without guidance and with dual guidance; text-to-image 16 x 16 in 32 steps with
guidance (cfg 3). Each prints the measured ratio next to the FLOP-predicted one (`lumina.model.flops`
`forward_flops` of every forward each run makes: backbone at the rows it computes, attention at the pairs the
segmented backend computes, plus the heads), and `batched` the throughput of 16 text prompts packed 16 per
forward against one at a time (with the cache). Each case also prints a roofline-predicted ratio: every
forward costs max(FLOPs / peak, weight bytes read / bandwidth), both rates measured in the same process on the
text head's matmul.

Measured 2026-12-06 on the 2-core CPU shared with other jobs (load average 6-9), 1 thread, medians
[min-max] of interleaved rounds (understanding 5 rounds with --official, the image cases and batched 3):
  understand  no cache 206.8 s [156.0-233.8]  cache 42.2 s [29.3-45.6]  4.90x [rounds 4.59-5.33]  FLOP 10.26x (0.48)
              official 197.0 s [172.6-238.8]  4.67x [4.21-5.89] against lumina with the cache (FLOP 10.95x)
  edit_none   no cache  68.2 s [67.7-75.1]   cache 64.1 s [63.5-65.5]  1.06x [1.04-1.18]  FLOP 1.13x (0.94)
  edit_dual   no cache  77.4 s [74.6-78.0]   cache 70.7 s [70.7-70.9]  1.09x [1.05-1.10]  FLOP 1.21x (0.91)
  t2i_guided  no cache  69.4 s [68.8-70.5]   cache 70.5 s [67.6-71.9]  0.98x [0.98-1.03]  FLOP 1.01x (0.98)
  batched     16 prompts per forward 0.55 prompts/s [29.0 s, 28.8-39.2], one at a time 0.37 [43.4 s]: 1.50x [1.12-1.51]
and on the quiet host (3 rounds): understand 115.1 s / 23.4 s = 4.91x [4.52-4.97], FLOP 10.26x (0.48),
roofline 7.81x (0.63). The image cases are bound by the channel head and the 8 codebook heads at every masked
cell (the same in both modes): the cache saves only the prompt's rows, P / (P + answer) of the backbone. The
cached understanding step is bound by reading the 157,184-word text head's weights (161 MB a step) and the
experts', which the FLOP count does not weigh. Profile, roofline and the GPU outlook: experiments/kv_cache.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_memory import SMALL_CONFIG  # noqa: E402
from timing import interleaved_times, median_seconds  # noqa: E402

from lumina.contract.schema import Media, Text  # noqa: E402
from lumina.contract.special_tokens import SpecialTokens  # noqa: E402
from lumina.generation import ImageSamplingConfig, Prompt, TextSamplingConfig, generate_images, generate_text  # noqa: E402
from lumina.model import LuminaModel  # noqa: E402
from lumina.model.config import LuminaConfig  # noqa: E402
from lumina.model.flops import forward_flops  # noqa: E402
from lumina.model.supervision import PackRows, is_image_code_row  # noqa: E402

BACKBONE_PARTS = ("embed", "attention", "attention_core", "dense_ffn", "router", "experts", "shared_expert",
                  "combine")
IMAGE_HEAD_PARTS = ("channel_head", "channel_attention", "image_heads")


def _image(seed: int, grid: tuple[int, int], codebooks: int, codes: int) -> Media:
    g = torch.Generator().manual_seed(seed)
    return Media("image", torch.randint(0, codes, (grid[0] * grid[1], codebooks), generator=g), grid)


def cases(tokens: SpecialTokens) -> dict:
    """name -> (sampler, prompts, config without `cache`)."""
    c, k = tokens.num_codebooks, tokens.codebook_size
    question = Text(list(range(1000, 1012)))
    return {
        "understand": (generate_text, [Prompt([_image(0, (32, 32), c, k), question], system=[900, 901])],
                       dict(gen_length=256, block_length=32, steps=32, temperature=0.0)),
        "edit_none": (generate_images, [Prompt([_image(1, (16, 16), c, k), question], grid=(16, 16))],
                      dict(steps=32, temperature=0.0, cfg_scale=0.0)),
        "edit_dual": (generate_images, [Prompt([_image(1, (16, 16), c, k), question], grid=(16, 16))],
                      dict(steps=32, temperature=0.0, cfg_scale=0.0, text_scale=1.5, image_scale=1.2)),
        "t2i_guided": (generate_images, [Prompt([question], grid=(16, 16))],
                       dict(steps=32, temperature=0.0, cfg_scale=3.0)),
    }


def config_of(sampler, fields: dict, cache: bool):  # noqa: ANN001, ANN201
    kind = TextSamplingConfig if sampler is generate_text else ImageSamplingConfig
    return kind(**fields, cache=cache)


@dataclass
class Machine:
    """This machine's rates on the text head's own matmul (the model's weight, this process's threads):
    `peak` FLOP/s at 256 rows, `bandwidth` weight bytes/s at 1 row (the whole weight read for almost no
    arithmetic)."""

    peak: float
    bandwidth: float

    @classmethod
    def measure(cls, model: LuminaModel) -> Machine:
        weight = model.lm_head.weight

        def seconds(rows: int) -> float:
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
            return median_seconds(lambda: torch.nn.functional.linear(x, weight), 7)

        return cls(2 * 256 * weight.numel() / seconds(256), weight.numel() * weight.element_size() / seconds(1))


def _bytes(module: torch.nn.Module, skip: str = "\0") -> tuple[int, int]:
    """(bytes of `module`'s routed-expert weights, bytes of the rest), names containing `skip` left out."""
    experts = rest = 0
    for name, p in module.named_parameters():
        if skip in name:
            continue
        size = p.numel() * p.element_size()
        experts, rest = (experts + size, rest) if ".experts." in name else (experts, rest + size)
    return experts, rest


@dataclass
class Work:
    """What one run() does: `flops` of its forwards, and `roofline` seconds: per forward max(FLOPs / peak,
    weight bytes read / bandwidth) on the measured `Machine`."""

    flops: int = 0
    roofline: float = 0.0


def counted_work(model: LuminaModel, run, machine: Machine) -> Work:  # noqa: ANN001
    """`Work` of one `run()`: every backbone forward at the rows it computes (attention: per segment query rows x
    key rows) plus the text head at the rows read and the image heads at the rows sampled. A forward reads the
    weights of its layers (embedding tables: only the rows gathered, not counted), of each routed expert with
    the probability that one of its rows picks it (1 - (1 - k / E) ** rows, uniform routing), and of the head it
    calls."""
    cfg, work = model.config, Work()
    real_backbone, real_sample, real_heads = model.backbone, model.sample_image_codes, model.heads
    expert_bytes, layer_bytes = _bytes(model.model, skip="embeddings.")
    text_head_bytes = sum(_bytes(model.lm_head))
    image_head_bytes = sum(_bytes(model.multi_codebook_head)) + sum(_bytes(model.lm_img_head))

    def add(flops: int, weight_bytes: float) -> None:
        work.flops += flops
        work.roofline += max(flops / machine.peak, weight_bytes / machine.bandwidth)

    def backbone(batch, cache=None):  # noqa: ANN001, ANN202
        keys = batch if cache is None else cache.keys
        q, kb = batch.seg_bounds, keys.seg_bounds
        pairs = sum((q[i + 1] - q[i]) * (kb[i + 1] - kb[i]) for i in range(len(q) - 1))
        rows = PackRows(batch.seq_len, 0, 0, int(is_image_code_row(batch.type_ids).sum()), 1)
        parts = forward_flops(cfg, rows, pairs)
        touched = 1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** batch.seq_len
        add(sum(parts[name] for name in BACKBONE_PARTS), layer_bytes + touched * expert_bytes)
        return real_backbone(batch, cache)

    def sample(h_rows, fn):  # noqa: ANN001, ANN202
        parts = forward_flops(cfg, PackRows(h_rows.shape[0], 0, h_rows.shape[0], 0, 1), 0)
        add(sum(parts[name] for name in IMAGE_HEAD_PARTS), image_head_bytes)
        return real_sample(h_rows, fn)

    class Heads:
        def __init__(self, heads):  # noqa: ANN001
            self.heads = heads

        def text_logits(self, h):  # noqa: ANN001, ANN202
            add(2 * h.shape[0] * cfg.hidden_size * cfg.vocab_size, text_head_bytes)
            return self.heads.text_logits(h)

    model.backbone, model.sample_image_codes, model.heads = backbone, sample, lambda: Heads(real_heads())
    try:
        run()
    finally:
        del model.backbone, model.sample_image_codes, model.heads
    return work


def _runner(model, sampler, prompts, tokens, config):  # noqa: ANN001, ANN202
    return lambda: sampler(model, prompts, tokens, config)


def first_call_counted(model: LuminaModel, run, work: list[Work], name: str, machine: Machine):  # noqa: ANN001, ANN201
    """`run`, whose first call also counts its `Work` into `work` (counted_work; the count costs microseconds
    per forward, so the counted call is timed like the rest); each call's seconds go to stderr as it ends."""
    def call() -> None:
        start = time.perf_counter()
        if work:
            run()
        else:
            work.append(counted_work(model, run, machine))
        print(f"  ({name}: {time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    return call


def spread(times: list[float]) -> str:
    return f"{statistics.median(times):7.2f} s [{min(times):.2f}-{max(times):.2f}]"


def official_understanding(model: LuminaModel, prompt: Prompt, tokens: SpecialTokens, fields: dict,
                           official: Path):  # noqa: ANN201
    """The official understanding generator (infer_mmu_sft.infer_single_turn_text -> generate_text_bd, from an
    InternLumina-U2 checkout at `official`) on the same model and prompt, through the interface the parity
    tests run it with (tests/generation/official/interface.py: lumina's backbone and heads behind the official
    call signature; it also checks every mask the official loop builds against lumina's rule). -> run() that
    returns the answer ids (cut before EOA, as the official loop does)."""
    sys.path[:0] = [str(official.resolve()), str(Path(__file__).resolve().parents[2] / "tests/generation/official")]
    import infer_mmu_sft as mmu
    from interface import OfficialInterface

    from lumina.generation.sequences import prompt_piece

    prefix = prompt_piece(prompt, tokens)
    p = len(prefix)
    interface = OfficialInterface(model, tokens, fields["block_length"])

    def run() -> list[int]:
        return mmu.infer_single_turn_text(
            interface, None, prefix.input_ids, prefix.type_ids, fields["gen_length"], fields["block_length"],
            fields["steps"], fields["temperature"], "cpu", prefix_turn_ids=torch.zeros(p, dtype=torch.long),
            prefix_block_ids=torch.full((p,), -1, dtype=torch.long), prefix_is_clean=torch.ones(p, dtype=torch.long),
            prefix_position_ids=torch.arange(p), generated_turn_id=1, generated_position_start=p + 1).tolist()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="understand,edit_none,edit_dual,t2i_guided,batched")
    parser.add_argument("--official", type=Path, default=None,
                        help="InternLumina-U2 checkout (infer_mmu_sft.py, generators/, utils/): the understanding "
                             "case also runs the official generator (the baseline)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = LuminaModel(LuminaConfig(**SMALL_CONFIG)).eval()
    tokens = SpecialTokens.official(newline=198)  # any text id serves as the '\n' token here
    with torch.no_grad():
        model.lm_head.weight[tokens.eoa] = 0.0  # no early stop: every block of every case is decoded
    wanted = args.cases.split(",")
    machine = Machine.measure(model)
    print(f"threads={torch.get_num_threads()} repeats={args.repeats} (medians [min-max] of interleaved rounds, "
          f"the order reversed every other round); text head matmul: {machine.peak / 1e9:.1f} GFLOP/s at 256 rows, "
          f"{machine.bandwidth / 1e9:.2f} GB/s of weights at 1 row")
    for name, (sampler, prompts, fields) in cases(tokens).items():
        if name not in wanted:
            continue
        runs = {f"cache={c}": _runner(model, sampler, prompts, tokens, config_of(sampler, fields, c))
                for c in (False, True)}
        if name == "understand" and args.official is not None:
            official = official_understanding(model, prompts[0], tokens, fields, args.official)
            ours = runs["cache=True"]()[0].ids
            print(f"understand  official answer == lumina's (cache): {official() == ours} ({len(ours)} tokens)")
            runs["official"] = official
        work: dict[str, list[Work]] = {key: [] for key in runs}
        times = interleaved_times({key: first_call_counted(model, run, work[key], f"{name} {key}", machine)
                                   for key, run in runs.items()}, args.repeats, warmup=False, alternate=True)
        cached = times["cache=True"]
        for key in [k for k in runs if k != "cache=True"]:
            rounds = [a / b for a, b in zip(times[key], cached, strict=True)]
            measured = statistics.median(times[key]) / statistics.median(cached)
            base, ours = work[key][0], work["cache=True"][0]
            predicted, roofline = base.flops / ours.flops, base.roofline / ours.roofline
            print(f"{name:11s} {key:11s} {spread(times[key])}  cache {spread(cached)}  measured {measured:5.2f}x "
                  f"[rounds {min(rounds):.2f}-{max(rounds):.2f}]  FLOP-predicted {predicted:5.2f}x  "
                  f"measured/predicted {measured / predicted:4.2f}  roofline-predicted {roofline:5.2f}x "
                  f"(roofline {base.roofline:.1f} s / {ours.roofline:.1f} s)  measured/roofline "
                  f"{measured / roofline:4.2f}", flush=True)
    if "batched" in wanted:
        prompts = [Prompt([Text(list(range(1000, 1004 + i)))], key=i) for i in range(16)]

        def batched(size: int):  # noqa: ANN202
            config = TextSamplingConfig(gen_length=32, block_length=32, steps=32, temperature=0.0, batch_size=size)
            return lambda: generate_text(model, prompts, tokens, config)

        times = interleaved_times({"16": batched(16), "1": batched(1)}, args.repeats, warmup=True, alternate=True)
        rounds = [a / b for a, b in zip(times["1"], times["16"], strict=True)]
        print(f"batched     16 text prompts (one block of 32 tokens, 32 steps, cache): 16 per forward "
              f"{spread(times['16'])} = {16 / statistics.median(times['16']):.2f} prompts/s, one at a time "
              f"{spread(times['1'])} = {16 / statistics.median(times['1']):.2f} prompts/s "
              f"({statistics.median(times['1']) / statistics.median(times['16']):.2f}x, rounds "
              f"{min(rounds):.2f}-{max(rounds):.2f})", flush=True)


if __name__ == "__main__":
    main()
