"""Requests: what the caller asks an engine for. Frozen; validated on construction."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto.contracts.audio import Audio
from mizuoto.errors import InvalidRequest

if TYPE_CHECKING:
    from mizuoto.contracts.voice import Voice

MAX_SEED = 2**32 - 1


def _freeze_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


def _check_text(field_name: str):
    def check(instance, attribute, value):
        if not isinstance(value, str):
            raise InvalidRequest(field_name, f"must be a string, got {type(value).__name__}")
        if not value.strip():
            raise InvalidRequest(field_name, "is empty", "give the words to speak")

    return check


def _check_seed(instance, attribute, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise InvalidRequest("seed", f"must be an integer in [0, {MAX_SEED}], got {value!r}",
                             "leave it unset to draw one")


def _check_positive_int(name: str):
    def check(instance, attribute, value):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise InvalidRequest(name, f"must be a positive integer, got {value!r}")

    return check


def _check_guidance(instance, attribute, value):
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or value < 0):
        raise InvalidRequest("guidance", f"must be a number >= 0, got {value!r}")


def _audio_source(value):
    if isinstance(value, (Audio, Path)):
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
    seed: int | None = attrs.field(default=None, validator=_check_seed)
    steps: int | None = attrs.field(default=None, validator=_check_positive_int("steps"))
    guidance: float | None = attrs.field(default=None, validator=_check_guidance)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)

    def __attrs_post_init__(self):
        if self.reference is not None and self.voice is not None:
            raise InvalidRequest("voice", "cannot be combined with reference",
                                 "pass either a reference recording or a saved voice")
        if self.instruction is not None and not self.instruction.strip():
            raise InvalidRequest("instruction", "is empty", "omit it or describe the voice")


def _check_segments(instance, attribute, value):
    if not value:
        raise InvalidRequest("segments", "is empty", "give at least one (start, end) in seconds")
    previous_end = 0.0
    for start, end in value:
        if not 0 <= start < end:
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
        converter=lambda v: tuple((float(a), float(b)) for a, b in v), validator=_check_segments
    )
    seed: int | None = attrs.field(default=None, validator=_check_seed)
    steps: int | None = attrs.field(default=None, validator=_check_positive_int("steps"))
    guidance: float | None = attrs.field(default=None, validator=_check_guidance)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)

    def __attrs_post_init__(self):
        if not self.reference.text or not self.reference.text.strip():
            raise InvalidRequest("reference.text", "is required for editing",
                                 "give the transcript of the recording")
