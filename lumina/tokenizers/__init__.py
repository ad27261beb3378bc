"""Tokenizers: text (built-in word-level, HF tokenizer.json) and the built-in residual-VQ image tokenizer."""

from lumina.tokenizers.rvq_quantizer import RVQImageTokenizer, RVQSettings
from lumina.tokenizers.text import (
    SPECIAL_TOKEN_STRINGS,
    HFTokenizer,
    TextTokenizer,
    WordTokenizer,
    special_tokens_of,
)

__all__ = ["HFTokenizer", "RVQImageTokenizer", "RVQSettings", "SPECIAL_TOKEN_STRINGS", "TextTokenizer",
           "WordTokenizer", "special_tokens_of"]
