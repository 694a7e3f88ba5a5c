"""VoxCPM's text preparation, as voxcpm 2.0.3's front-ends do it.

The order is upstream's: the web demo (``app.py``) strips the text and writes a voice-design /
style instruction as a ``(instruction)`` prefix; ``VoxCPM.generate`` (``core.py``) then turns
every run of whitespace into one space and, when asked, normalizes the whole string (prefix
included); the model finally tokenizes ``prompt_text + target_text`` with nothing between them.
The prompt transcript is only stripped (CLI and demo); it is neither collapsed nor normalized.
"""

from __future__ import annotations

import re
from typing import Protocol

__all__ = ["collapse_whitespace", "model_text", "prepare_prompt_text", "prepare_target_text",
           "with_instruction"]

_WHITESPACE_RUN = re.compile(r"\s+")
_PARENTHESES = re.compile(r"[()（）]")


class _Normalizer(Protocol):
    def normalize(self, text: str) -> str: ...


def collapse_whitespace(text: str) -> str:
    """Every run of whitespace (newlines, tabs, U+3000, ...) becomes one space; the ends are
    kept (``VoxCPM._generate``)."""
    return _WHITESPACE_RUN.sub(" ", text.replace("\n", " "))


def with_instruction(text: str, instruction: str | None) -> str:
    """``(instruction)text`` as the web demo builds it: both stripped, and the instruction's own
    parentheses (ASCII and full-width) removed so they cannot close the prefix early. An empty
    instruction adds nothing."""
    text = text.strip()
    instruction = _PARENTHESES.sub("", (instruction or "").strip()).strip()
    return f"({instruction}){text}" if instruction else text


def prepare_target_text(text: str, *, instruction: str | None = None, normalize: bool = False,
                        normalizer: _Normalizer | None = None) -> str:
    """The text VoxCPM speaks: instruction prefix, whitespace collapsed, then (optionally)
    normalized with :class:`mizuoto.text.TextNormalizer` (or ``normalizer`` if given)."""
    if not text.strip():
        raise ValueError("text is empty: give the words to speak")
    text = collapse_whitespace(with_instruction(text, instruction))
    if normalize:
        if normalizer is None:
            from mizuoto.text import normalize_text

            return normalize_text(text)
        text = normalizer.normalize(text)
    return text


def prepare_prompt_text(text: str) -> str:
    """The transcript of a prompt (continuation) recording: stripped, nothing else."""
    return text.strip()


def model_text(target_text: str, prompt_text: str | None = None) -> str:
    """What the model tokenizes: the prompt transcript and the target text, joined with no
    separator (upstream writes ``prompt_text + target_text``)."""
    return (prompt_text or "") + target_text
