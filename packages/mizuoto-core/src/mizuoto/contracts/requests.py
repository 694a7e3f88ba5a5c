"""Requests: what the caller asks an engine for. Frozen; validated on construction."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidRequest
from mizuoto.runtime.seeds import MAX_SEED
from mizuoto.validation.audio import check_input_audio
from mizuoto.validation.ranges import check_number, number_in, plain_number, shown

#: Largest sampler step count a request may ask for (engines' defaults are 10 to 32).
MAX_STEPS = 1000
#: Largest guidance (classifier-free guidance strength) a request may ask for.
MAX_GUIDANCE = 100.0
#: Longest text (characters) a request may hold: about two hours of speech, whose audio
#: (hundreds of MB) is held in memory; split longer texts into several requests.
MAX_TEXT_CHARS = 100_000
#: Latest time, in seconds, an edited segment may start or end at.
MAX_SEGMENT_SECONDS = 3600.0


def _freeze_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidRequest("params", f"must be a mapping of settings, got {type(value).__name__}")
    if any(not isinstance(key, str) for key in value or {}):
        raise InvalidRequest("params", "keys must be strings (the settings' names)")
    return MappingProxyType(dict(value or {}))


def _check_length(field_name: str, value: str) -> None:
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidRequest(field_name, f"has {len(value)} characters, more than "
                             f"{MAX_TEXT_CHARS}", "split it into several requests")


def is_blank(text: str) -> bool:
    """Whether ``text`` has nothing to speak: only whitespace and invisible format characters (zero-width space/joiners U+200B-U+200D, word joiner U+2060, BOM U+FEFF,
    soft hyphen, bidi marks: Unicode category Cf). The one test of "empty" for every front
    end, so text of only zero-width characters is refused as whitespace is (control characters
    are dropped first, with their own message: :func:`drop_control_characters`)."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


#: Control characters kept in text: line breaks and tabs are layout, and upstream handles them.
KEPT_CONTROL = frozenset("\n\r\t")


def drop_control_characters(field_name: str, text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` without control characters (Unicode category Cc other than line breaks and
    tabs: NUL, bell, escape sequences pasted from a terminal, ...), and the warning to report.

    Text made only of control characters raises :class:`InvalidRequest` for ``field_name``.
    """
    dropped = [c for c in text if c not in KEPT_CONTROL and unicodedata.category(c) == "Cc"]
    if not dropped:
        return text, ()
    kept = "".join(c for c in text if c in KEPT_CONTROL or unicodedata.category(c) != "Cc")
    if is_blank(kept):
        raise InvalidRequest(field_name, "holds only control characters",
                             "give the words to speak")
    codes = ", ".join(f"U+{ord(c):04X}" for c in sorted(set(dropped))[:6])
    return kept, (f"{field_name}: dropped {len(dropped)} control character(s) ({codes})",)


def _clean_text(request) -> None:
    """Drop control characters from a request's ``text`` and record the notice (frozen class:
    set once, in ``__attrs_post_init__``)."""
    text, notices = drop_control_characters("text", request.text)
    object.__setattr__(request, "text", text)
    object.__setattr__(request, "notices", notices)


def _check_text(field_name: str):
    def check(instance, attribute, value):
        if not isinstance(value, str):
            raise InvalidRequest(field_name, f"must be a string, got {type(value).__name__}")
        if is_blank(value):
            raise InvalidRequest(field_name, "is empty", "give the words to speak")
        half = next((c for c in value if "\ud800" <= c <= "\udfff"), None)
        if half is not None:
            raise InvalidRequest(field_name, f"holds a lone surrogate U+{ord(half):04X} (half "
                                 "of a UTF-16 pair), which no file or tokenizer can encode",
                                 "pass the character itself (decode the text as UTF-8)")
        _check_length(field_name, value)

    return check


def _check_seed(instance, attribute, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise InvalidRequest("seed", f"must be an integer in [0, {MAX_SEED}], got {shown(value)}",
                             "leave it unset to draw one")


def _check_steps(instance, attribute, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_STEPS):
        raise InvalidRequest("steps", f"must be an integer in [1, {MAX_STEPS}], got "
                             f"{shown(value)}", "leave it unset for the engine's default")


_check_guidance = number_in("guidance", 0.0, MAX_GUIDANCE, optional=True)


def _number_field(validator):
    """An optional number of a request: NumPy numbers made plain, then ``validator``."""
    return attrs.field(default=None, converter=plain_number, validator=validator)


def _audio_source(value):
    if isinstance(value, Audio):
        check_input_audio(value.samples, value.sample_rate, "reference.audio")
        return value
    if isinstance(value, Path):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise InvalidRequest("reference.audio", f"must be a path or an Audio, got {type(value).__name__}")


@attrs.frozen
class Reference:
    """A recording of the voice to clone (or to continue / edit) and, optionally, its transcript."""

    audio: Audio | Path = attrs.field(converter=_audio_source)
    text: str | None = attrs.field(default=None)

    @text.validator
    def _text(self, attribute, value):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest("reference.text", "must be a string")
        if value is not None:
            _check_length("reference.text", value)


@attrs.frozen
class SynthesisRequest:
    """Speak ``text``.

    ``reference`` clones a voice; ``voice`` reuses a saved one; ``instruction`` describes a voice
    or a style (voice design). ``steps`` and ``guidance`` are the sampler's step count and
    guidance strength; ``None`` means the engine's default. ``params`` holds engine-specific
    settings, validated by the engine (unknown keys are rejected with their name).
    """

    text: str = attrs.field(validator=_check_text("text"))
    reference: Reference | None = None
    voice: Voice | None = None
    instruction: str | None = None
    seed: int | None = _number_field(_check_seed)
    steps: int | None = _number_field(_check_steps)
    guidance: float | None = _number_field(_check_guidance)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
    #: What validation changed in the request (control characters dropped from ``text``);
    #: the engine base class adds these to the result's ``applied.warnings``.
    notices: tuple[str, ...] = attrs.field(default=(), init=False, eq=False)

    def __attrs_post_init__(self):
        _clean_text(self)
        if self.reference is not None and not isinstance(self.reference, Reference):
            raise InvalidRequest("reference", f"must be a Reference, got "
                                 f"{type(self.reference).__name__}")
        if self.voice is not None and not isinstance(self.voice, Voice):
            raise InvalidRequest("voice", f"must be a Voice (Voice.load(path)), got "
                                 f"{type(self.voice).__name__}")
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise InvalidRequest("instruction", "must be a string")
        if self.instruction is not None:
            _check_length("instruction", self.instruction)
        if self.reference is not None and self.voice is not None:
            raise InvalidRequest("voice", "cannot be combined with reference",
                                 "pass either a reference recording or a saved voice")
        if self.instruction is not None and is_blank(self.instruction):
            raise InvalidRequest("instruction", "is empty", "omit it or describe the voice")


def _segments(value) -> tuple[tuple[float, float], ...]:
    """``(start, end)`` pairs of numbers, finite and within :data:`MAX_SEGMENT_SECONDS`."""
    try:
        pairs = [tuple(pair) for pair in value]
    except TypeError:
        raise InvalidRequest("segments", "must be a list of (start, end) pairs in seconds") \
            from None
    for pair in pairs:
        if len(pair) != 2:
            raise InvalidRequest("segments", f"{shown(pair)} must be a (start, end) pair")
        for bound in pair:
            check_number("segments", bound, 0.0, MAX_SEGMENT_SECONDS)
    return tuple((float(start), float(end)) for start, end in pairs)


def _check_segments(instance, attribute, value):
    if not value:
        raise InvalidRequest("segments", "is empty", "give at least one (start, end) in seconds")
    previous_end = 0.0
    for start, end in value:
        if not start < end:
            raise InvalidRequest("segments", f"({start}, {end}) must satisfy 0 <= start < end")
        if start < previous_end:
            raise InvalidRequest("segments", "must be sorted and must not overlap")
        previous_end = end


@attrs.frozen
class EditRequest:
    """Replace time spans of a recording with new words.

    ``reference`` is the recording and its transcript; ``text`` is the transcript after the
    edit; ``segments`` are the ``(start, end)`` spans in seconds to regenerate.
    """

    reference: Reference
    text: str = attrs.field(validator=_check_text("text"))
    segments: tuple[tuple[float, float], ...] = attrs.field(
        converter=_segments, validator=_check_segments
    )
    seed: int | None = _number_field(_check_seed)
    steps: int | None = _number_field(_check_steps)
    guidance: float | None = _number_field(_check_guidance)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
    notices: tuple[str, ...] = attrs.field(default=(), init=False, eq=False)

    def __attrs_post_init__(self):
        _clean_text(self)
        if not isinstance(self.reference, Reference):
            raise InvalidRequest("reference", "must be a Reference (the recording and its "
                                 f"transcript), got {type(self.reference).__name__}")
        if not self.reference.text or not self.reference.text.strip():
            raise InvalidRequest("reference.text", "is required for editing",
                                 "give the transcript of the recording")
