"""Downloaded F5-TTS voice files that are not what build_voice makes: refused by name (the voice,
with the fix) before anything is generated (issue 33, 2)."""

from __future__ import annotations

import attrs
import pytest
import torch

from mizuoto import SynthesisRequest
from mizuoto.errors import InvalidRequest


@pytest.fixture(scope="module")
def voice(engine, ref):
    return engine.build_voice(ref)


def _hostile(voice):
    wave = voice.tensors["waveform"]
    return {
        "empty [1, 0]": (attrs.evolve(voice, tensors={"waveform": torch.zeros(1, 0)}), "shape"),
        "3-D": (attrs.evolve(voice, tensors={"waveform": wave[None]}), "shape"),
        "1-D": (attrs.evolve(voice, tensors={"waveform": wave[0]}), "shape"),
        "silent": (attrs.evolve(voice, tensors={"waveform": torch.zeros_like(wave)}), "silent"),
        "NaN": (attrs.evolve(voice, tensors={"waveform": wave * float("nan")}), "not finite"),
        "integers": (attrs.evolve(voice, tensors={"waveform": wave.to(torch.int16)}),
                     "not float"),
        "empty reference_text": (attrs.evolve(voice, texts={k: "  " for k in voice.texts}),
                                 "reference text is empty"),
        "rate 1 Hz": (attrs.evolve(voice, sample_rate=1), "sample rate"),
        "an hour long": (attrs.evolve(voice, tensors={"waveform": torch.ones(1, 3600 * 100)},
                                      sample_rate=100), "sample rate|long"),
    }


@pytest.mark.parametrize("case", ["empty [1, 0]", "3-D", "1-D", "silent", "NaN", "integers",
                                  "empty reference_text", "rate 1 Hz", "an hour long"])
def test_a_voice_that_is_not_f5s_is_refused_by_name(engine, voice, case):
    hostile, named = _hostile(voice)[case]
    with pytest.raises(InvalidRequest, match=named) as info:
        engine.synthesize(SynthesisRequest("hello", seed=1, voice=hostile, steps=2))
    assert info.value.field == "voice" and "save" in info.value.fix
