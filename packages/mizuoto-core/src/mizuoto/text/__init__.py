"""Text front-end shared by engines: normalization of numbers, dates, units and symbols."""

from mizuoto.text.normalize import (
    Language,
    NormalizerUnavailable,
    TextNormalizer,
    detect_language,
    normalize_text,
)

__all__ = ["Language", "NormalizerUnavailable", "TextNormalizer", "detect_language",
           "normalize_text"]
