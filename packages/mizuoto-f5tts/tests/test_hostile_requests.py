"""Requests that ask for more than they say: the work a request may cost is bounded before
any sampling, and the error names the field that asked for it (issue 54, 9)."""

from __future__ import annotations

import pytest

from mizuoto import Reference, SynthesisRequest
from mizuoto.errors import InvalidRequest


def _refused(engine, request) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as raised:
        engine.synthesize(request)
    return raised.value


@pytest.mark.parametrize("seconds", [2_400.0, 3_599.5])
def test_a_long_fixed_duration_is_blamed_on_fix_duration(engine, ref, seconds):
    error = _refused(engine, SynthesisRequest("Two words.", reference=ref, steps=1,
                                              params={"fix_duration": seconds}))
    assert error.field == "params.fix_duration", error


def test_a_slow_speed_on_a_long_text_is_blamed_on_speed(engine, ref):
    text = "🎉" * 3_000  # 12,000 UTF-8 bytes: upstream's estimate counts bytes
    error = _refused(engine, SynthesisRequest(text, reference=ref, steps=1,
                                              params={"speed": 0.15}))
    assert error.field == "params.speed" and "s of speech for 3,000 characters" in str(error)


def test_a_huge_reference_transcript_is_blamed_on_the_reference(engine, ref):
    transcript = "word " * 12_000
    error = _refused(engine, SynthesisRequest(
        "Hello there.", reference=Reference(ref.audio, text=transcript), steps=1))
    assert error.field == "reference.text", error
