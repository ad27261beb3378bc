"""The conversations of the official-parity fixtures and the tokenizer they are tokenised with, shared by the
fixture generator (`make_fixtures.py`, run against the official scripts) and the tests that compare lumina with
its output. Only `tokenizers` and `torch` are needed here.

The tokenizer is word-level over the official id space (157,184 ids): every special token of the contract at
its official id, "\\n" a token of its own at NEWLINE, the words of the cases from WORD_BASE on, unused
fillers elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

VOCAB_SIZE = 157184
NEWLINE = 201
WORD_BASE = 1000
SPECIALS = {  # utils/tokenizer_contract.py, plus pad
    "<|pad|>": 156892, "<|mask|>": 156895, "<system>": 157153, "</system>": 157154, "<user>": 157155,
    "<uncondition>": 157156, "</user>": 157157, "<3D_CONTEXT>": 157158, "<IMG_CONTEXT>": 157160,
    "<VIDEO_CONTEXT>": 157161, "<answer>": 157165, "</answer>": 157166, "<BOI>": 157167, "<EOI>": 157168,
    "<BO3d>": 157169, "<EO3d>": 157170, "<BOV>": 157171, "<EOV>": 157172,
}
# the official scripts' default system prompts, keyed like lumina.contract.system_prompts: read from the official modules
# by make_fixtures.py (official_system_prompts) and recorded in sequences.json ("system_prompts")
# user texts of the cases (as a client passes them to the official scripts)
USER = {
    "understand_image": "what colour is the square ?",
    "understand_two_images": "which picture is brighter ?",
    "understand_mid_text": "compare <IMG_CONTEXT> with a red square .",
    "understand_later_turn": "and this one ?",
    "understand_video": "what happens in the clip ?",
    "understand_mesh3d": "what object is this ?",
    "text_qa": "what is two plus two ?",
    "t2i": "a red square on a blue sky .",
    "edit": "make the square green .",
}
IMAGE_GRID = (2, 3)
VIDEO_GRID = (2, 2, 2)  # (t, h, w)
MESH_GRID = (2, 2, 2)  # (z, y, x)
T2I_GRID = (2, 2)


def words(system_prompts: dict[str, str]) -> list[str]:
    texts = list(system_prompts.values()) + [t.replace("<IMG_CONTEXT>", " ") for t in USER.values()]
    return sorted({w for t in texts for w in t.split()})


def fixture_tokenizer(system_prompts: dict[str, str]) -> Tokenizer:
    """Word-level over the official id space; its words: those of the cases' user texts and `system_prompts`."""
    vocab = {f"<unused_{i}>": i for i in range(VOCAB_SIZE)}
    named = {**SPECIALS, "\n": NEWLINE, **{w: WORD_BASE + i for i, w in enumerate(words(system_prompts))}}
    for name, i in named.items():
        del vocab[f"<unused_{i}>"]
        vocab[name] = i
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unused_0>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken("\n", normalized=False)])
    return tok


def codes(n: int, seed: int) -> torch.Tensor:
    """[n, 8] deterministic codes in [0, 4096)."""
    return (torch.arange(n * 8).reshape(n, 8) * 37 + seed * 101) % 4096


# ---- lumina-generate parity (temperature 0, on interface.write_tiny_checkpoint) ----
PARITY_SEED = 65513
PARITY_T2I = {"t2i_8_steps": 8, "t2i_16_steps": 16}  # on a 4 x 4 grid, guidance 0
PARITY_T2I_GRID = (4, 4)
# guided image answers, 8 steps each: t2i on the 4 x 4 grid; editing the understanding image (coords4.pt) on its
# own grid, with single guidance (the official editing default scale) and with dual guidance
PARITY_GUIDED = {"t2i_guided": {"cfg_scale": 3.0}, "edit_guided": {"cfg_scale": 1.0},
                 "edit_dual_guided": {"cfg_scale": 0.0, "cfg_text": 1.5, "cfg_img": 0.5}}
PARITY_GUIDED_STEPS = 8
SECOND_IMAGE_SEED = 4  # `codes` seed of the second understanding image (the first: 1)
PARITY_UNDERSTAND = {"gen_length": 16, "block_length": 8, "steps": 4}
PARITY_TEXT = {"gen_length": 12, "block_length": 8, "steps": 4}  # a partial last block of 4


def write_token_files(directory) -> dict:
    """The understanding image as three official token files: .pt with 4 and with 5 coords columns, and a .pkl
    of NumPy arrays (torch.save); rows and columns in the coords' last-but-one pair (row, col)."""
    import numpy as np

    directory = Path(directory)
    h, w = IMAGE_GRID
    indices = codes(h * w, 1)
    four = torch.tensor([[0, 0, r, c] for r in range(h) for c in range(w)])
    five = torch.tensor([[0, 0, r, c, 0] for r in range(h) for c in range(w)])
    files = {"coords4.pt": {"indices": indices, "coords": four}, "coords5.pt": {"indices": indices, "coords": five},
             "numpy.pkl": {"indices": indices.numpy().astype(np.int32), "coords": four.numpy().astype(np.int32)}}
    paths = {}
    for name, payload in files.items():
        paths[name] = directory / name
        torch.save(payload, paths[name])
    return paths


def write_second_image(directory) -> Path:
    """A second, different understanding image (codes seed SECOND_IMAGE_SEED) as a 4-column .pt token file."""
    h, w = IMAGE_GRID
    path = Path(directory) / "second.pt"
    torch.save({"indices": codes(h * w, SECOND_IMAGE_SEED),
                "coords": torch.tensor([[0, 0, r, c] for r in range(h) for c in range(w)])}, path)
    return path


def write_video_file(directory) -> Path:
    """The video of the sequence cases (codes seed 2, grid VIDEO_GRID) as an official video token file: coords
    (batch, t, x, y, z), written last frame first and in (x, y) order, so readers must sort it into (t, y, x)."""
    t, h, w = VIDEO_GRID
    cells = [(f, y, x) for f in reversed(range(t)) for x in range(w) for y in range(h)]
    coords = torch.tensor([[0, f, x, y, 0] for f, y, x in cells])
    order = torch.tensor([(f * h + y) * w + x for f, y, x in cells])
    path = Path(directory) / "video.pt"
    torch.save({"indices": codes(t * h * w, 2)[order], "coords": coords}, path)
    return path
