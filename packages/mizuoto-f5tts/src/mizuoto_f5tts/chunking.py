"""Long text: split at punctuation into chunks the model speaks one at a time.

Chunk size is counted in UTF-8 bytes and scaled to the reference: as many bytes as the
reference speaks per second, times the seconds left of a 22-second budget.
"""

from __future__ import annotations

import re

# Split after ASCII punctuation followed by whitespace, or right after CJK punctuation.
_SENTENCE_END = re.compile(r"(?<=[;:,.!?])\s+|(?<=[；：，。！？])")

# Seconds of audio (reference + generated) one chunk aims for.
_CHUNK_SECONDS = 22


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8"))


def max_chunk_bytes(reference_text: str, reference_samples: int, sample_rate: int,
                    speed: float = 1.0) -> int:
    """Upstream's ``max_chars``: bytes per chunk for this reference and speed.

    ``reference_samples`` / ``sample_rate`` describe the prepared reference at its own rate
    (before resampling), and ``reference_text`` is its transcript as prepared (ending in ". ").
    """
    seconds = reference_samples / sample_rate
    return int(_byte_len(reference_text) / seconds * (_CHUNK_SECONDS - seconds) * speed)


def chunk_text(text: str, max_bytes: int = 135) -> list[str]:
    """Split ``text`` into chunks of at most ``max_bytes`` UTF-8 bytes, at sentence punctuation.

    A sentence longer than ``max_bytes`` becomes a chunk of its own. Sentences ending in a
    1-byte character are joined with a space; CJK sentences are joined directly.
    """
    chunks: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(text):
        if not sentence:
            continue
        piece = sentence + " " if _byte_len(sentence[-1]) == 1 else sentence
        if _byte_len(current) + _byte_len(sentence) <= max_bytes:
            current += piece
        else:
            if current:
                chunks.append(current.strip())
            current = piece
    if current:
        chunks.append(current.strip())
    return chunks


def split_to_fit(chunk: str, max_bytes: int) -> list[str]:
    """``chunk`` cut into pieces of at most ``max_bytes`` UTF-8 bytes (at least one character
    each): after the last space that fits, else between characters. For a chunk upstream's
    splitter leaves too long for the model (a long text without sentence punctuation), which
    upstream cannot speak at all; chunks that fit are never cut."""
    pieces: list[str] = []
    rest = chunk.strip()
    while rest:
        if _byte_len(rest) <= max_bytes:
            pieces.append(rest)
            break
        end, size = 0, 0
        while end < len(rest) and size + _byte_len(rest[end]) <= max_bytes:
            size += _byte_len(rest[end])
            end += 1
        end = max(end, 1)
        space = rest.rfind(" ", 0, end + 1)
        cut = space if space > 0 else end
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return [p for p in pieces if p]
