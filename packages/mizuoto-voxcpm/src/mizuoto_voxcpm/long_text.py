"""Splitting text that is too long for one generation into sentence chunks.

Upstream speaks any text in one generation, up to the model's context (``max_length``
positions for prompt, text and audio together) and raises when it is full. Mizuoto splits
instead, when asked (``split_text``) or when the text would not fit: at sentence ends
(。！？!?;；, and . followed by a space), packing whole sentences into chunks of at most
``chunk_tokens`` text tokens; a sentence longer than that is a chunk of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=\.)(?=\s)")


def split_sentences(text: str) -> list[str]:
    return [part for part in _SENTENCE_END.split(text) if part.strip()]


def pack_chunks(text: str, count_tokens: Callable[[str], int], chunk_tokens: int) -> list[str]:
    """Whole sentences of ``text`` joined into chunks of at most ``chunk_tokens`` tokens."""
    chunks: list[str] = []
    current = ""
    for sentence in split_sentences(text):
        candidate = current + sentence
        if current and count_tokens(candidate) > chunk_tokens:
            chunks.append(current.strip())
            current = sentence
        else:
            current = candidate
    if current.strip():
        chunks.append(current.strip())
    return chunks or [text]
