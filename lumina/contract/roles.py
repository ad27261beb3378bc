"""The token roles of a sequence (the official `type_ids`) and the label of an unsupervised row."""

from __future__ import annotations

from enum import IntEnum


class TokenType(IntEnum):
    """type_ids values (official contract 5.2)."""

    PAD = 0
    TEXT = 1  # text prompt (and the markers around media and answers)
    MEDIA = 2  # media prompt: its C columns are image codes
    TEXT_ANSWER = 3
    IMAGE_ANSWER = 4  # its C columns are image codes


IMAGE_CODE_TYPES = (TokenType.MEDIA, TokenType.IMAGE_ANSWER)  # rows embedded through the codebook tables
IGNORE_INDEX = -100  # the label of a row (or column) that is not supervised
