"""Text normalization: numbers, dates, money, units to words, the way voxcpm 2.0.3 does it.

voxcpm's ``TextNormalizer`` (from CosyVoice's frontend) cleans Markdown and emoji, picks
Chinese when the text holds any CJK ideograph (English otherwise), runs wetext 0.1.2's
tagger / reorder / verbalizer FSTs, then applies a few string fixes. We call wetext's FST
steps ourselves in wetext's order (strip, tag, reorder, verbalize, strip) and reproduce the
string fixes, so the output matches upstream character for character.

Needs the optional extra: ``pip install 'mizuoto-core[text]'`` (wetext, inflect, regex).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from mizuoto.errors import MizuotoError

__all__ = ["Language", "NormalizerUnavailable", "TextNormalizer", "detect_language",
           "normalize_text"]

Language = Literal["zh", "en"]

_CJK = re.compile(r"[\u4e00-\u9fff]+")
_ANY_DIGIT = re.compile(r"\d")
_ERHUA = re.compile(r"儿|兒")
# Characters that make voxcpm treat "a-1" as arithmetic (spaced minus) rather than a hyphen.
_MATH_HINT = re.compile(r"([\d$%^*_+≥≤≠×÷?=])")
_HYPHEN_BEFORE_DIGIT = re.compile(r"(?<=[a-zA-Z0-9])-(?=\d)")


class NormalizerUnavailable(MizuotoError, ImportError):
    """Text normalization was asked for but its optional dependencies are not installed."""

    exit_code = 3

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"text normalization needs {missing}, which is not installed: "
            "pip install 'mizuoto-core[text]' (wetext==0.1.2, inflect, regex)"
        )


def detect_language(text: str) -> Language:
    """"zh" when ``text`` holds any CJK unified ideograph (U+4E00..U+9FFF), else "en"."""
    return "zh" if _CJK.search(text) else "en"


def _clean_markdown(text: str) -> str:
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks
    text = re.sub(r"`[^`]*`", "", text)  # inline code
    text = re.sub(r"!\[[^\]]*\]\([^\)]+\)", "", text)  # images
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)  # links keep their text
    text = re.sub(r"^(\s*)-\s+", r"\1", text, flags=re.MULTILINE)  # list bullets
    # upstream strips anything tag-like, so "<|...|>" or "<s>" in the text vanish too
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"^#{1,6}\s*", "", text, flags=re.MULTILINE)  # headings
    text = re.sub(r"\n\s*\n", "\n", text)  # blank lines
    return text.strip()


def _replace_blank(text: str) -> str:
    """Drop spaces unless both neighbours are non-space ASCII (CosyVoice's replace_blank)."""
    kept = []
    for i, char in enumerate(text):
        # upstream quirk: text[i - 1] wraps to the last character when i == 0
        if char == " " and not (
            (text[i + 1].isascii() and text[i + 1] != " ")
            and (text[i - 1].isascii() and text[i - 1] != " ")
        ):
            continue
        kept.append(char)
    return "".join(kept)


def _replace_corner_marks(text: str) -> str:
    for symbol, words in (("²", "平方"), ("³", "立方"), ("√", "根号"), ("≈", "约等于"),
                          ("<", "小于")):
        text = text.replace(symbol, words)
    return text


def _remove_brackets(text: str) -> str:
    text = text.replace("（", " ").replace("）", " ")
    text = text.replace("【", " ").replace("】", " ")
    text = text.replace("`", "")
    return text.replace("——", " ")


def _spell_out_numbers(text: str, inflect_engine: Any) -> str:
    """Each run of ``str.isdigit`` characters through inflect's number_to_words."""
    return "".join(
        inflect_engine.number_to_words(piece) if piece[0].isdigit() else piece
        for piece in _digit_runs(text)
    )


def _digit_runs(text: str) -> list[str]:
    # str.isdigit, not \d: upstream splits on isdigit, which also accepts "²", "①" and the like
    pieces: list[str] = []
    for char in text:
        if pieces and char.isdigit() and pieces[-1][0].isdigit():
            pieces[-1] += char
        else:
            pieces.append(char)
    return pieces


class TextNormalizer:
    """voxcpm's text normalizer. ``normalize(text)`` is ``TextNormalizer().normalize(text)``
    of voxcpm 2.0.3. Loading wetext's FSTs takes a moment: build one and reuse it."""

    def __init__(self) -> None:
        try:
            import wetext
        except ImportError as error:
            raise NormalizerUnavailable("wetext") from error
        try:
            import inflect
        except ImportError as error:
            raise NormalizerUnavailable("inflect") from error
        try:
            import regex
        except ImportError as error:
            raise NormalizerUnavailable("regex") from error
        self._wetext = wetext
        self._inflect = inflect.engine()
        self._emoji = regex.compile(r"\p{Emoji_Presentation}|\p{Emoji}\uFE0F", flags=regex.UNICODE)

    def _clean(self, text: str) -> str:
        text = _clean_markdown(text)
        text = self._emoji.sub("", text)
        text = text.replace("\n", " ").replace("\t", " ")
        return text.replace("“", '"').replace("”", '"')

    def _wetext_tn(self, text: str, language: Language, *, remove_erhua: bool) -> str:
        """wetext 0.1.2's ``Normalizer(lang=..., operator="tn").normalize`` step by step."""
        text = text.strip()
        if _ANY_DIGIT.search(text) or (remove_erhua and _ERHUA.search(text)):
            text = self._wetext.tag(text, language, "tn")
            text = self._wetext.reorder(text, language, "tn")
            text = self._wetext.verbalize(text, language, "tn", remove_erhua)
        return text.strip()

    def normalize(self, text: str) -> str:
        language = detect_language(text)  # decided on the raw text, before cleaning
        text = self._clean(text)
        if language == "zh":
            text = text.replace("=", "等于")
            if _MATH_HINT.search(text):
                text = _HYPHEN_BEFORE_DIGIT.sub(" - ", text)
            text = self._wetext_tn(text, "zh", remove_erhua=True)
            text = _replace_blank(text)
            text = _replace_corner_marks(text)
            return _remove_brackets(text)
        text = self._wetext_tn(text, "en", remove_erhua=False)
        return _spell_out_numbers(text, self._inflect)


@functools.cache
def _shared_normalizer() -> TextNormalizer:
    return TextNormalizer()


def normalize_text(text: str) -> str:
    """Normalize with a process-wide :class:`TextNormalizer` (built on first use)."""
    return _shared_normalizer().normalize(text)
