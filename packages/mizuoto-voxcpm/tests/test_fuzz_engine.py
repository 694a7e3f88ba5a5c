"""Property tests on tiny random VoxCPM models (first generation in bfloat16, VoxCPM2 in float32):
synthesize, stream and build_voice with arbitrary text, numbers, params, instructions and
reference audio. Each call gives finite audio in [-1, 1] at the model's rate, or raises a
MizuotoError; text extremes (any Unicode, long words, a 1 MB line) included."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mizuoto import Audio, Reference, SynthesisRequest, Voice
from mizuoto.errors import InvalidRequest, MizuotoError
from mizuoto_contract.strategies import (
    HOSTILE_NUMBERS,
    TEXT,
    check_speaks,
    check_streams,
    mostly,
    reference_samples,
)
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import write_random_model

# Each example runs a model: a quarter of the profile's examples (ci: 10, fuzz: 200).
ENGINE_RUNS = settings(max_examples=max(5, settings.default.max_examples // 4))

# Valid params kept small (few patches, few steps) so that an example takes milliseconds.
VALID_PARAMS = st.fixed_dictionaries({"max_len": st.integers(1, 4)}, optional={
    "inference_timesteps": st.integers(1, 3),
    "cfg_value": st.floats(0, 100),
    "min_len": st.integers(0, 3),
    "retry_badcase": st.booleans(),
    "retry_badcase_max_times": st.integers(1, 3),
    "retry_badcase_ratio_threshold": st.floats(0, 100),
    "reference_prefix": st.booleans(),
    "split_text": st.booleans(),
    "chunk_tokens": st.integers(1, 400),
    "tiled_decode": st.booleans(),
})
HOSTILE_PARAMS = st.dictionaries(
    st.sampled_from(["inference_timesteps", "cfg_value", "min_len", "max_len", "normalize",
                     "retry_badcase_max_times", "retry_badcase_ratio_threshold", "chunk_tokens",
                     "temperature"]),
    st.one_of(HOSTILE_NUMBERS, st.floats(-2, 200), st.integers(-3, 70000)), min_size=1,
    max_size=3)
PARAMS = mostly(VALID_PARAMS, HOSTILE_PARAMS)
STEPS = mostly(st.one_of(st.none(), st.integers(1, 3)), HOSTILE_NUMBERS)
GUIDANCE = mostly(st.one_of(st.none(), st.floats(0, 100)), HOSTILE_NUMBERS)
GENERATION = st.sampled_from(["v1", "v2"])


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"v1": VoxCPMEngine.load(write_random_model(root / "v1", "voxcpm-0.5b")),
            "v2": VoxCPMEngine.load(write_random_model(root / "v2", "voxcpm2", dtype="float32"))}


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio") / "ref.wav"
    t = np.arange(int(0.4 * 22050)) / 22050
    soundfile.write(path, 0.3 * np.sin(2 * np.pi * 220 * t), 22050)
    return path


@st.composite
def requests(draw, wav):
    """Request fields: a reference (with or without its transcript), an instruction or neither."""
    fields = {"text": draw(TEXT), "steps": draw(STEPS), "guidance": draw(GUIDANCE),
              "params": draw(PARAMS), "seed": draw(st.one_of(st.none(), st.integers(0, 99)))}
    voice = draw(st.sampled_from(["none", "reference", "instruction"]))
    if voice == "reference":
        fields["reference"] = Reference(wav, draw(st.one_of(st.none(), TEXT)))
    elif voice == "instruction":
        fields["instruction"] = draw(TEXT)
    return fields


@ENGINE_RUNS
@given(generation=GENERATION, data=st.data())
def test_synthesize_gives_finite_audio_or_a_named_error(engines, wav, generation, data):
    engine, fields = engines[generation], data.draw(requests(wav))
    check_speaks(engine, lambda: engine.synthesize(SynthesisRequest(**fields)))


@ENGINE_RUNS
@given(generation=GENERATION, data=st.data())
def test_stream_gives_finite_chunks_or_a_named_error(engines, wav, generation, data):
    engine, fields = engines[generation], data.draw(requests(wav))
    check_streams(engine, lambda: engine.stream(SynthesisRequest(**fields)))


@ENGINE_RUNS
@given(generation=GENERATION, source=reference_samples(), text=mostly(TEXT, st.none()))
def test_build_voice_and_speak_with_it(engines, tmp_path_factory, generation, source, text):
    engine = engines[generation]
    samples, rate = source
    try:
        voice = engine.build_voice(Reference(Audio(samples, rate), text))
    except MizuotoError as exc:
        event(f"no voice: {type(exc).__name__}")
        return
    path = voice.save(tmp_path_factory.mktemp("voice") / "voice.safetensors")
    request = SynthesisRequest("Hi there.", voice=Voice.load(path), seed=3,
                               params={"max_len": 3, "inference_timesteps": 2})
    check_speaks(engine, lambda: engine.synthesize(request))


# -- text extremes ----------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["a" * 20_000, "word " * 20_000, "\u0301" * 50_000])
def test_a_sentence_longer_than_the_context_is_a_named_error(engines, text):
    """No sentence punctuation to split at, more positions than the model's context."""
    for engine in engines.values():
        with pytest.raises(InvalidRequest) as raised:
            engine.synthesize(SynthesisRequest(text, seed=1, params={"max_len": 2}))
        assert raised.value.field == "text"


def test_many_sentences_are_split_and_spoken(engines):
    engine = engines["v2"]
    result = engine.synthesize(SynthesisRequest("Hi. " * 500, seed=1, steps=1,
                                                params={"max_len": 1, "min_len": 0}))
    assert result.applied.chunks > 1
    check_speaks(engine, lambda: result)


# -- the defects fuzzing found (each was NaN audio or a bare exception) -----------------------

@pytest.mark.parametrize("params, field", [
    ({"cfg_value": float("nan")}, "params.cfg_value"),  # was all-NaN audio
    ({"retry_badcase_ratio_threshold": float("inf")},    # was a bare OverflowError
     "params.retry_badcase_ratio_threshold"),
    ({"max_len": 10**30}, "params.max_len"),
])
def test_found_defects_are_named_errors(engines, params, field):
    with pytest.raises(InvalidRequest) as raised:
        engines["v2"].synthesize(SynthesisRequest("Hello.", seed=1, params=params))
    assert raised.value.field == field
