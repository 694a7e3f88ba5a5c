"""What an engine (or one of its models) can do."""

from __future__ import annotations

import enum


class Capability(enum.StrEnum):
    ZERO_SHOT = "zero_shot"  # speak without any reference voice
    CLONE = "clone"  # speak in the voice of a reference recording
    CONTINUATION = "continuation"  # continue a prompt recording (reference text required)
    EDIT = "edit"  # replace time spans of a recording with new words
    DESIGN = "design"  # describe a voice in words (instruction)
    STREAM = "stream"  # yield audio while generating
    VOICE_CACHE = "voice_cache"  # build a voice once, save it, reuse it
    LONG_TEXT = "long_text"  # split long text into chunks and join the audio
