"""lumina's LuminaModel behind the call interface of the official generators (generators/*.py), so that their
code runs unchanged on a lumina checkpoint, and a tiny checkpoint in the official layout to run them on.

The official generators call `model(x, type_ids, attention_mask=<4-D additive mask>, infer_mmu=True, is_clean=..,
position_ids=..)` for text logits at the noisy answer rows, and `model(input_ids=.., type_position_ids=..,
attention_mask=.., infer_t2i=True, ...)` for hidden states at the image-answer rows, and then use the channel
head's parts (`multi_codebook_head.condition_proj`, `.channel_blocks`, ..., `lm_img_head`, `model.img_embeddings`).
`OfficialInterface` answers those calls with lumina's backbone and heads. lumina's attention takes per-row
metadata, not a mask: the interface derives turn / block ids from the official layout (prompt turn 0 up to the
first BOA, the answer turn 1; answer blocks counted from the row after BOA) and checks on every call that
lumina's attention rule on that metadata allows exactly what the official mask allows. The channel head's bf16
mask buffer is handed out in the model's dtype (its values are 0 and -inf), as the official loop needs in fp32.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from lumina.attention import allowed_mask
from lumina.checkpoint.save import save_pretrained
from lumina.contract.special_tokens import SpecialTokens
from lumina.contract.training_sequence import TrainingSequence
from lumina.data.packing import collate_pack
from lumina.model import LuminaModel
from lumina.model.config import LuminaConfig


def tiny_official_config() -> LuminaConfig:
    """The tiny model with the official token spaces: 157,184 words, 8 codebooks of 4,096 codes."""
    return LuminaConfig.tiny(vocab_size=157184, pad_token_id=156892, num_codebooks=8, codebook_size=4096,
                             image_vocab_size=5010)


def write_tiny_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A tiny checkpoint in the official split layout whose parameters are seeded draws in key order (0.05 *
    N(0, 1), norm weights 1 + 0.05 * N(0, 1)): independent of lumina's initialisation code."""
    model = LuminaModel(tiny_official_config())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = 0.05 * torch.randn(param.shape, generator=gen, dtype=torch.float32)
            param.copy_(noise + 1.0 if "norm" in name and param.dim() == 1 else noise)
    return save_pretrained(model, directory, overwrite=True)


def _channel_block(block: nn.Module):
    return lambda x, attn_mask, c: block(x, c, attn_mask)


class OfficialInterface(nn.Module):
    """`model` (a LuminaModel) as the official generators call it; `block_length`: the text sampler's."""

    def __init__(self, model: LuminaModel, tokens: SpecialTokens, block_length: int = 32) -> None:
        super().__init__()
        self.lumina, self.tokens, self.block_length = model, tokens, block_length
        self.model = model.model  # .img_embeddings
        self.lm_img_head = model.lm_img_head
        head = model.multi_codebook_head
        dtype = next(model.parameters()).dtype
        self.multi_codebook_head = SimpleNamespace(
            condition_proj=head.condition_proj, timesteps_embeddings=head.timesteps_embeddings,
            channel_embed=head.channel_embed, channel_mask=head.channel_mask.to(dtype),
            channel_blocks=[_channel_block(b) for b in head.channel_blocks], channel_norm=head.channel_norm,
            channel_final=head.channel_final)
        self.mask_checks = 0

    def forward(self, input_ids, type_position_ids, attention_mask=None, infer_mmu=False, infer_t2i=False,
                is_clean=None, position_ids=None, cat=None, use_cache=None):
        ids, types = input_ids[0], type_position_ids[0]
        n = ids.shape[0]
        prompt_len = int((ids[:, 0] == self.tokens.boa).nonzero()[0, 0])
        turns = (torch.arange(n) >= prompt_len).long()
        blocks = torch.full((n,), -1, dtype=torch.long)
        if infer_mmu:
            clean = is_clean[0].bool()
            positions = position_ids[0].long()
            blocks[prompt_len] = 0
            blocks[prompt_len + 1:] = (positions[prompt_len + 1:] - positions[prompt_len] - 1) // self.block_length
        else:
            clean = torch.arange(n) < prompt_len
            positions = torch.arange(n) if position_ids is None else position_ids[0].long()
            blocks[prompt_len:] = 0
        seq = TrainingSequence(sample_id="official", input_ids=ids.long(), labels=torch.full_like(ids, -100),
                               type_ids=types.long(), turn_ids=turns, block_ids=blocks, position_ids=positions,
                               is_clean=clean, noise_t=torch.zeros(n), answer_mask=torch.zeros(n, dtype=torch.bool))
        ours = allowed_mask(torch.ones(1, n, dtype=torch.bool), torch.tensor([0, n], dtype=torch.int32),
                            types[None], turns[None], clean[None], blocks[None])[0]
        theirs = attention_mask[0, 0] == 0
        if not torch.equal(ours, theirs):
            bad = (ours != theirs).nonzero()[:4].tolist()
            raise AssertionError(f"lumina's attention rule differs from the official mask at (query, key) {bad}")
        self.mask_checks += 1
        batch = collate_pack([seq], n, self.tokens.pad, ids.shape[1])
        hidden = self.lumina.backbone(batch)[0]
        if infer_mmu:
            return self.lumina.heads().text_logits(hidden[(types == 3) & ~clean])
        return hidden[types == 4].unsqueeze(0)
