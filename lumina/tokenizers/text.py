"""Text tokenizers: the built-in word-level tokenizer of the scene world, and a wrapper for real
checkpoints' HF `tokenizer.json` (via the `tokenizers` package). Both map text <-> token ids and expose
their special-token ids by the official token strings (`SPECIAL_TOKEN_STRINGS`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from lumina.contract.special_tokens import PLACEHOLDER_FIELDS, SpecialTokens

# The official special tokens (contract section 7) + pad, unk and "\n": the built-in vocabulary's ids 0.. .
NEWLINE = "\n"
SPECIAL_TOKEN_STRINGS = (
    "<|pad|>", "<|unk|>", "<|mask|>", "<system>", "</system>", "<user>", "<uncondition>", "</user>",
    "<3D_CONTEXT>", "<IMG_CONTEXT>", "<VIDEO_CONTEXT>", "<answer>", "</answer>",
    "<BOI>", "<EOI>", "<BO3d>", "<EO3d>", "<BOV>", "<EOV>", NEWLINE,
)
UNK = "<|unk|>"
# What a word-level vocabulary of an older lumina lacks (refused by `WordTokenizer.load`).
VOCABULARY_CHANGE = "lumina's word vocabularies gained the prompt template's '\\n' token (id 19)"


class TextTokenizer(Protocol):
    vocab_size: int
    special_ids: dict[str, int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class WordTokenizer:
    """Whitespace word-level tokenizer: SPECIAL_TOKEN_STRINGS then `words`; "\n" is a token of its own, other
    whitespace separates words. Unknown words raise (no silent <|unk|>)."""

    def __init__(self, words: Sequence[str]):
        vocab = list(SPECIAL_TOKEN_STRINGS) + list(words)
        for i, word in enumerate(vocab):
            if word == NEWLINE and i < len(SPECIAL_TOKEN_STRINGS):
                continue
            if not word or word != word.strip() or len(word.split()) != 1:
                raise ValueError(f"words[{i - len(SPECIAL_TOKEN_STRINGS)}]={word!r}: a word must be non-empty "
                                 "and contain no whitespace")
        if len(set(vocab)) != len(vocab):
            dup = sorted({w for w in vocab if vocab.count(w) > 1})
            raise ValueError(f"words has duplicates (or repeats a special token): {dup}")
        self.vocab = vocab
        self._ids = {w: i for i, w in enumerate(vocab)}
        self.special_ids = {w: self._ids[w] for w in SPECIAL_TOKEN_STRINGS}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        ids = []
        for n, line in enumerate(text.split(NEWLINE)):
            if n:
                ids.append(self._ids[NEWLINE])
            for position, word in enumerate(line.split()):
                if word not in self._ids:
                    raise ValueError(f"text word {position} {word!r} is not in the vocabulary (text={text!r})")
                ids.append(self._ids[word])
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        words = []
        for position, i in enumerate(ids):
            if not 0 <= int(i) < len(self.vocab):
                raise ValueError(f"ids[{position}]={i}: outside the vocabulary [0, {len(self.vocab)})")
            if skip_special_tokens and int(i) < len(SPECIAL_TOKEN_STRINGS):
                continue
            words.append(self.vocab[int(i)])
        return " ".join(words).replace(f" {NEWLINE} ", NEWLINE)

    def to_hf(self) -> Tokenizer:
        """The same tokenizer as an HF `tokenizers.Tokenizer` (WordLevel; "\n" an added token)."""
        tok = Tokenizer(WordLevel(vocab=dict(self._ids), unk_token=UNK))
        tok.pre_tokenizer = WhitespaceSplit()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKEN_STRINGS
                                if s != NEWLINE])
        tok.add_tokens([AddedToken(NEWLINE, normalized=False)])
        return tok

    def save(self, path: str | Path) -> Path:
        """Write an HF `tokenizer.json` (loadable with `tokenizers.Tokenizer.from_file` or `HFTokenizer`)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.to_hf().save(str(path))
        return path

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        """Read back a `tokenizer.json` written by `save` (the WordLevel vocabulary in id order)."""
        vocab = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        ordered = sorted(vocab, key=vocab.__getitem__)
        if [vocab[w] for w in ordered] != list(range(len(ordered))):
            raise ValueError(f"{path}: not a lumina word-level tokenizer (ids not dense)")
        specials = tuple(ordered[:len(SPECIAL_TOKEN_STRINGS)])
        if specials != SPECIAL_TOKEN_STRINGS:
            if specials[:-1] == SPECIAL_TOKEN_STRINGS[:-1]:
                raise ValueError(f"{path}: a word vocabulary made before {VOCABULARY_CHANGE}; its data and "
                                 "checkpoints predate the prompt template: rebuild them")
            raise ValueError(f"{path}: not a lumina word-level tokenizer (specials not first)")
        return cls(ordered[len(SPECIAL_TOKEN_STRINGS):])


class HFTokenizer:
    """A checkpoint's `tokenizer.json`; `encode` adds no special tokens."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            self.path = self.path / "tokenizer.json"
        if not self.path.is_file():
            raise FileNotFoundError(f"tokenizer file {self.path} does not exist")
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the tokenizers package raises a bare Exception for a file it cannot parse
            raise ValueError(f"tokenizer file {self.path} is not a tokenizer.json the tokenizers package reads: "
                             f"{exc}") from exc
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.special_ids = {s: vocab[s] for s in SPECIAL_TOKEN_STRINGS if s in vocab}

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


# SpecialTokens text fields -> the token string that holds each id
SPECIAL_FIELD_STRINGS = {
    "pad": "<|pad|>", "text_mask": "<|mask|>", "boa": "<answer>", "eoa": "</answer>", "boi": "<BOI>",
    "eoi": "<EOI>", "bov": "<BOV>", "eov": "<EOV>", "bo3d": "<BO3d>", "eo3d": "<EO3d>",
    "system_open": "<system>", "system_close": "</system>", "user_open": "<user>", "user_close": "</user>",
    "uncondition": "<uncondition>",
}


# SpecialTokens template fields -> their token strings (optional: -1 when the vocabulary has none)
TEMPLATE_FIELD_STRINGS = {"img_context": "<IMG_CONTEXT>", "video_context": "<VIDEO_CONTEXT>",
                          "mesh3d_context": "<3D_CONTEXT>"}
# media kind -> its placeholder string in user text
PLACEHOLDER_STRINGS = {kind: TEMPLATE_FIELD_STRINGS[field] for kind, field in PLACEHOLDER_FIELDS.items()}


def newline_id(tokenizer: TextTokenizer) -> int:
    """The tokenizer's id of "\n" (-1 when "\n" is not one token of its own)."""
    ids = tokenizer.encode(NEWLINE)
    return ids[0] if len(ids) == 1 else -1


def special_tokens_of(tokenizer: TextTokenizer, codebook_size: int, num_codebooks: int,
                      image_vocab_size: int = 5010, **overrides: int) -> SpecialTokens:
    """The `SpecialTokens` of a text tokenizer's vocabulary (image markers official, placeholders and "\n" -1
    where it has none); `overrides` supply ids it lacks (e.g. pad=156892)."""
    ids = {}
    for field, string in SPECIAL_FIELD_STRINGS.items():
        if field in overrides:
            continue
        if string not in tokenizer.special_ids:
            raise ValueError(f"tokenizer has no {string!r} token for SpecialTokens.{field}; pass {field}=<id>")
        ids[field] = tokenizer.special_ids[string]
    for field, string in TEMPLATE_FIELD_STRINGS.items():
        ids[field] = tokenizer.special_ids.get(string, -1)
    ids["newline"] = newline_id(tokenizer)
    ids.update(overrides)
    return SpecialTokens(text_vocab_size=tokenizer.vocab_size, codebook_size=codebook_size,
                         num_codebooks=num_codebooks, image_vocab_size=image_vocab_size, **ids)


def check_special_ids(tokenizer: TextTokenizer, tokens: SpecialTokens) -> None:
    """Each special string the tokenizer defines must have the dataset's id; ValueError names both ids."""
    defined = tokenizer.special_ids
    for field, string in {**SPECIAL_FIELD_STRINGS, **TEMPLATE_FIELD_STRINGS}.items():
        if string in defined and defined[string] != getattr(tokens, field):
            raise ValueError(f"tokenizer defines {string!r} as id {defined[string]}, but the dataset's special "
                             f"tokens put {field} at {getattr(tokens, field)}: a tokenizer of another model? "
                             "(--special-tokens tokenizer takes the tokenizer's ids)")
