"""Masked image generation (contract 6.3): text-to-image and editing. A prompt's answer is a grid of h x w
cells, all masked at the start. Each step: one backbone forward over every prompt's guidance branches (one
pack), guidance on the masked cells' hidden states (or logits), the C codebooks of every masked cell sampled
through the channel head, confidence = mean of the C probabilities (model dtype), and the cells below the
keep_k-th lowest log(confidence) + temperature * Gumbel masked again (keep_k: the masking schedule's
`image_keep`; every step commits at least one cell). At temperature 0 this is the official `generate_image_ar`
rule for rule; above 0 the random streams differ from the official ones. With `cache` (default) only the
prompt of each branch (an edit's source image included) is final under the full rules; it is computed once,
every later step runs the answer rows against its cached keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lumina.contract.schema import Text
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.packing import collate_pack
from lumina.generation.cache import SamplerForward
from lumina.generation.guidance import guide_dual, guide_single
from lumina.generation.sampling import gumbel, model_schedule, remask_lowest, sample_tokens, seeded_generator
from lumina.generation.sampling_config import ImageSamplingConfig
from lumina.generation.sequences import BRANCHES, Prompt, image_sequence
from lumina.generation.sync import any_rank, max_over_ranks, model_device, prepare_for_sampling
from lumina.model.image_heads import SampleFn


@dataclass
class ImageAnswer:
    """codes [h * w, C] int64 in row-major cell order (what a token file's `indices` holds); grid (h, w)."""

    codes: torch.Tensor
    grid: tuple[int, int]


@dataclass
class StepTrace:
    """What one step did, per prompt: cells committed so far, the guided hidden states [n_masked, H] and the
    cells still masked after the step (bool [h * w]; which cells a step committed, for trajectory replay)."""

    committed: list[int]
    guided: list[torch.Tensor] | None = None
    masked: list[torch.Tensor] | None = None


@torch.no_grad()
def generate_images(model: nn.Module, prompts: list[Prompt], tokens: SpecialTokens,
                    config: ImageSamplingConfig | None = None,
                    trace: list[StepTrace] | None = None) -> list[ImageAnswer]:
    """Images for `prompts` (each with `grid` set; editing prompts hold their source image as a Media part).
    `trace`, when a list, receives one StepTrace per step of the first batch."""
    config = config or ImageSamplingConfig()
    prepare_for_sampling(model)
    device = model_device(model)
    size = config.batch_size
    answers: list[ImageAnswer] = []
    num_batches = max_over_ranks(-(-len(prompts) // size), device)  # ranks with fewer batches run dummies
    for b in range(num_batches):
        chunk = prompts[b * size:(b + 1) * size]
        dummy = not chunk
        if dummy:
            chunk = [Prompt([Text([])], grid=(1, 1), key="dummy")]
        forward = SamplerForward(model, config.cache, config.cache_budget_gib)
        codes = _generate_batch(model, forward, chunk, tokens, config, device,
                                trace if b == 0 and not dummy else None)
        forward.close(f"image batch {b}")
        if not dummy:
            answers += [ImageAnswer(c.cpu(), p.grid) for c, p in zip(codes, chunk, strict=True)]
    return answers


def _generate_batch(model: nn.Module, forward: SamplerForward, prompts: list[Prompt], tokens: SpecialTokens,
                    config: ImageSamplingConfig, device: torch.device,
                    trace: list[StepTrace] | None) -> list[torch.Tensor]:
    branches = BRANCHES["dual" if config.dual else "single" if config.cfg_scale != 0 else "none"]
    sequences, cell_rows = [], []  # cell_rows[branch][prompt]: flat rows [n_cells]
    offset = 0
    cacheable = [0] * len(prompts)  # per prompt, over its branches: rows that are not answer cells
    for drop_text, drop_image in branches:
        rows_of_branch = []
        for i, p in enumerate(prompts):
            seq, rows = image_sequence(p, tokens, drop_text, drop_image)
            sequences.append(seq)
            rows_of_branch.append((rows + offset).to(device))
            offset += len(seq)
            cacheable[i] += len(seq) - len(rows)
        cell_rows.append(rows_of_branch)
    forward.reserve([(p.key, n) for p, n in zip(prompts, cacheable, strict=True)])
    names = [(b, i) for b in range(len(branches)) for i in range(len(prompts))]  # one segment each, in order
    wanted = torch.cat([rows for rows_of_branch in cell_rows for rows in rows_of_branch])
    # single guidance with a negative branch identical to the conditional one (the prompt is already
    # `<uncondition>`, no media) guides nothing: h = h_c (contract 6.3)
    n = len(prompts)
    unguided = [len(branches) == 2 and _same_sequence(sequences[i], sequences[n + i]) for i in range(n)]
    batch = collate_pack(sequences, offset, tokens.pad, tokens.num_codebooks).to(device)
    generators = [seeded_generator(config.seed, p.key, "image", device) for p in prompts]
    num_cells = [p.grid[0] * p.grid[1] for p in prompts]
    masked = [torch.ones(n, dtype=torch.bool, device=device) for n in num_cells]
    codes = [torch.full((n, tokens.num_codebooks), tokens.image_mask, dtype=torch.long, device=device)
             for n in num_cells]
    tau = config.temperature
    schedule = model_schedule(model)

    def sample_fn(logits: torch.Tensor, codebook: int) -> tuple[torch.Tensor, torch.Tensor]:
        counts = [int(m.sum()) for m in masked]
        scaled = logits / tau if tau > 0 else logits
        return sample_tokens(scaled, 1.0 if tau > 0 else 0.0, generators, counts, config.top_k, config.top_p,
                             confidence_dtype=logits.dtype)

    for step in range(config.steps):
        if not any_rank(any(bool(m.any()) for m in masked), device):
            break  # every cell committed (ranks agree, so their forwards stay in lockstep)
        flat = forward(batch, wanted, names).split(num_cells * len(branches))
        per = len(prompts)
        cells = [flat[b * per:(b + 1) * per] for b in range(len(branches))]  # cells[branch][prompt]: [n_cells, H]
        if config.guidance == "logits" and len(branches) > 1:
            guided = [cells[0][i][masked[i]] for i in range(len(prompts))]  # traced: h_c
            new_codes, probs = _sample_logit_guided(model, cells, masked, config, sample_fn)
        else:
            guided = [_combine([branch[i][masked[i]] for branch in cells], config, unguided[i])
                      for i in range(len(prompts))]
            new_codes, probs = model.sample_image_codes(torch.cat(guided), sample_fn)
        confidence = probs.mean(dim=1)  # in the model's dtype, like the official sampler
        start = 0
        for i, n in enumerate(num_cells):
            where = masked[i].nonzero().squeeze(1)
            k = where.numel()
            codes[i][where] = new_codes[start:start + k]
            score = torch.log(confidence[start:start + k].clamp_min(1e-20))
            if tau > 0:
                score = score + tau * gumbel((k,), generators[i], device).to(score.dtype)
            remask = where[remask_lowest(score, schedule.image_keep(n, step, config.steps))]
            codes[i][remask] = tokens.image_mask
            masked[i] = torch.zeros_like(masked[i]).index_fill_(0, remask, True)
            start += k
            for rows_of_branch in cell_rows:
                batch.input_ids[0, rows_of_branch[i]] = codes[i]
        if trace is not None:
            trace.append(StepTrace([n - int(m.sum()) for n, m in zip(num_cells, masked, strict=True)],
                                   [g.cpu() for g in guided], [m.cpu() for m in masked]))
    return codes


def _combine(branches: list[torch.Tensor], config: ImageSamplingConfig, unguided: bool = False
             ) -> torch.Tensor:
    """The branches' [N, D] tensors (conditional first) -> guided [N, D] (h_c when `unguided`)."""
    if config.dual:
        return guide_dual(*branches, config.text_scale, config.image_scale)
    negative = None if unguided or len(branches) == 1 else branches[1]
    return guide_single(branches[0], negative, config.cfg_scale)


def _sample_logit_guided(model: nn.Module, cells: list[list[torch.Tensor]], masked: list[torch.Tensor],
                         config: ImageSamplingConfig, sample_fn: SampleFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Guidance on logits: the channel head runs on every branch's masked-cell states at once (cells[branch]
    [prompt]: [n_cells, H]); per codebook the branches' logits [N, K] are combined like hidden states, one code
    per cell is sampled, and every branch embeds it for the next codebook. -> (codes [N, C], probabilities
    [N, C]) of the guided draw."""
    states = [torch.cat([branch[i][m] for i, m in enumerate(masked)]) for branch in cells]

    def guided_fn(logits: torch.Tensor, codebook: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, probs = sample_fn(_combine(list(logits.chunk(len(cells))), config), codebook)
        return tokens.repeat(len(cells)), probs.repeat(len(cells))

    codes, probs = model.sample_image_codes(torch.cat(states), guided_fn)
    num = states[0].shape[0]
    return codes[:num], probs[:num]


def _same_sequence(a: TrainingSequence, b: TrainingSequence) -> bool:
    """Two branches' sequences agree in every id and metadata column the backbone reads."""
    names = ("input_ids", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean")
    return len(a) == len(b) and all(torch.equal(getattr(a, k), getattr(b, k)) for k in names)
