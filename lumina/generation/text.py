"""Block-diffusion text decoding (contract 6.2): understanding and text QA. Per prompt the answer grows one
block at a time (`TextSamplingConfig`). A block starts as text-mask ids; each step runs the backbone, samples
a candidate and its confidence (fp64) at the block's masked rows, and commits the scheduled number of most
confident rows (the masking schedule's `text_commits`; steps that commit nothing are skipped, as they change
nothing in the official sampler). A finished block becomes clean context for the next; a prompt stops after
the first block that holds EOA. Prompts are packed up to `batch_size` per forward. With `cache` (default) a
step computes only the rows the key/value cache does not hold: the prompt, the BOA and the committed blocks are
final (the full rules), each written once; a committed block by the next block's first step, as clean rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lumina.contract.schema import Text
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.packing import collate_pack
from lumina.generation.cache import SamplerForward
from lumina.generation.sampling import model_schedule, sample_tokens, seeded_generator
from lumina.generation.sampling_config import TextSamplingConfig
from lumina.generation.sequences import Prompt, prompt_piece, text_sequence
from lumina.generation.sync import any_rank, max_over_ranks, model_device, prepare_for_sampling


@dataclass
class TextAnswer:
    """ids: answer tokens before the first EOA (all decoded tokens if none); finished: EOA was produced;
    raw: every decoded token, incl. EOA and what follows it in its block; commit_step: per raw token, the step of
    its block at which it was committed (the sampler's path, which trajectory replay scores)."""

    ids: list[int]
    finished: bool
    raw: list[int]
    commit_step: list[int]


class _State:
    def __init__(self, index: int, prompt: Prompt, tokens: SpecialTokens, generator: torch.Generator) -> None:
        self.index = index  # its segment's name in the batch's cache
        self.key = prompt.key
        self.piece = prompt_piece(prompt, tokens)
        self.generator = generator
        self.answer: list[int] = []
        self.commit_step: list[int] = []
        self.done = False


@torch.no_grad()
def generate_text(model: nn.Module, prompts: list[Prompt], tokens: SpecialTokens,
                  config: TextSamplingConfig | None = None) -> list[TextAnswer]:
    """Answers for `prompts` (this rank's share under data parallelism: ranks may hold different numbers of
    prompts and finish at different blocks; they stay in lockstep, see `lumina.generation.sync`)."""
    config = config or TextSamplingConfig()
    prepare_for_sampling(model)
    device = model_device(model)
    answers: list[TextAnswer] = []
    size = config.batch_size
    num_batches = max_over_ranks(-(-len(prompts) // size), device)
    for b in range(num_batches):
        chunk = prompts[b * size:(b + 1) * size]
        states = [_State(i, p, tokens, seeded_generator(config.seed, p.key, "text", device))
                  for i, p in enumerate(chunk)]
        forward = SamplerForward(model, config.cache, config.cache_budget_gib)
        # what a prompt may cache: prompt, BOA and every block but the last (never committed as clean rows)
        forward.reserve([(s.key, len(s.piece) + 1 + (config.num_blocks - 1) * config.block_length)
                         for s in states])
        _decode_batch(model, forward, states, tokens, config, device)
        forward.close(f"text batch {b}")
        answers += [_answer_of(s, tokens) for s in states]
    return answers


def _answer_of(state: _State, tokens: SpecialTokens) -> TextAnswer:
    raw, finished = state.answer, tokens.eoa in state.answer
    return TextAnswer(raw[:raw.index(tokens.eoa)] if finished else list(raw), finished, list(raw),
                      list(state.commit_step))


def _decode_batch(model: nn.Module, forward: SamplerForward, states: list[_State], tokens: SpecialTokens,
                  config: TextSamplingConfig, device: torch.device) -> None:
    """Decode every state's answer; keeps going (with dummy steps) while any rank has an unfinished prompt."""
    for block_index in range(config.num_blocks):
        active = [s for s in states if not s.done]
        if not any_rank(bool(active), device):  # the per-block agreement
            return
        length = config.block_size(block_index)
        if active:
            _decode_block(model, forward, active, block_index, length, tokens, config, device)
        else:
            _dummy_block(model, length, tokens, config, device)
        for s in active:
            s.done = tokens.eoa in s.answer[block_index * config.block_length:]


def _decode_block(model: nn.Module, forward: SamplerForward, states: list[_State], block_index: int, length: int,
                  tokens: SpecialTokens, config: TextSamplingConfig, device: torch.device) -> None:
    """Decode block `block_index` ([length] slots, length <= block_length) of every state's answer."""
    mask = torch.full((length,), tokens.text_mask, dtype=torch.long)
    sequences, block_rows = [], []
    offset = 0
    for s in states:
        seq, rows = text_sequence(s.piece, s.answer, mask, block_index, tokens, config.block_length)
        sequences.append(seq)
        block_rows.append(rows + offset)
        offset += len(seq)
    batch = collate_pack(sequences, offset, tokens.pad, tokens.num_codebooks).to(device)
    rows = torch.stack(block_rows).to(device)  # [P, length] flat rows of each current block
    names = [s.index for s in states]
    schedule = model_schedule(model).text_commits(length, config.steps)
    step_of = torch.full(rows.shape, -1, dtype=torch.long, device=device)  # [P, L] the step committing each slot
    for step in range(config.steps):
        if schedule[step] == 0 and config.threshold is None:
            continue  # commits nothing (steps > length); the same on every rank
        ids = batch.input_ids[0, :, 0][rows]  # [P, L]
        masked = ids == tokens.text_mask
        if config.threshold is not None and not any_rank(bool(masked.any()), device):
            break  # every rank committed its whole block early (threshold); the ranks agree to stop
        if not masked.any():
            _dummy_step(model, tokens, device)
            continue
        query = rows[masked]
        logits = model.heads().text_logits(forward(batch, query, names))
        counts = masked.sum(1).tolist()
        active = [i for i, n in enumerate(counts) if n]
        candidates, confidence = sample_tokens(
            logits, config.temperature, [states[i].generator for i in active], [counts[i] for i in active],
            config.top_k, config.top_p)
        commit = _choose_commits(masked, confidence, schedule[step], config.threshold)
        new_ids = ids.clone()
        new_ids[masked] = torch.where(commit, candidates, tokens.text_mask)
        committed = torch.zeros_like(masked)
        committed[masked] = commit
        step_of[committed] = step
        batch.input_ids[0, rows.reshape(-1)] = new_ids.reshape(-1, 1).expand(-1, batch.input_ids.shape[-1])
    final = batch.input_ids[0, :, 0][rows].tolist()
    for s, block, when in zip(states, final, step_of.tolist(), strict=True):
        s.answer.extend(block)
        s.commit_step.extend(when)


def _choose_commits(masked: torch.Tensor, confidence: torch.Tensor, count: int,
                    threshold: float | None) -> torch.Tensor:
    """masked [P, L] bool; confidence [N] for the masked slots in row-major order -> commit [N] bool: per
    prompt the `count` most confident masked slots, or with `threshold` every slot above it if at least
    `count` are."""
    full = torch.full(masked.shape, float("-inf"), dtype=torch.float64, device=masked.device)
    full[masked] = confidence
    k = min(count, masked.shape[1])
    chosen = torch.zeros_like(masked)
    if k:
        chosen.scatter_(1, torch.topk(full, k, dim=1).indices, True)
    if threshold is not None:
        above = full > threshold
        enough = above.sum(1, keepdim=True) >= k
        chosen = torch.where(enough & above.any(1, keepdim=True), above, chosen)
    return (chosen & masked)[masked]


def _dummy_step(model: nn.Module, tokens: SpecialTokens, device: torch.device) -> None:
    """The forwards of one step on a one-row dummy answer, for a rank with nothing left to decode."""
    piece = prompt_piece(Prompt([Text([])]), tokens)
    seq, rows = text_sequence(piece, [], torch.full((1,), tokens.text_mask, dtype=torch.long), 0, tokens, 1)
    batch = collate_pack([seq], len(seq), tokens.pad, tokens.num_codebooks).to(device)
    model.heads().text_logits(model.backbone(batch)[0, rows.to(device)])


def _dummy_block(model: nn.Module, length: int, tokens: SpecialTokens, config: TextSamplingConfig,
                 device: torch.device) -> None:
    for count in model_schedule(model).text_commits(length, config.steps):
        if count == 0 and config.threshold is None:
            continue
        if config.threshold is not None and not any_rank(False, device):
            break
        _dummy_step(model, tokens, device)
