"""Property tests on the tiny random F5-TTS model: synthesize, edit and build_voice with arbitrary
text, numbers, params and reference audio. Each call gives finite audio in [-1, 1] at 24 kHz,
or raises a MizuotoError; text extremes (any Unicode, long words, a 1 MB line) included."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mizuoto
from mizuoto import Audio, EditRequest, Reference, SynthesisRequest, Voice
from mizuoto.contracts.requests import MAX_TEXT_CHARS
from mizuoto.errors import InvalidAudio, InvalidRequest, MizuotoError
from mizuoto.nn.flow import time_grid
from mizuoto_contract.strategies import (
    HOSTILE_NUMBERS,
    TEXT,
    check_speaks,
    mostly,
    reference_samples,
)
from mizuoto_f5tts import F5Engine

# Each example runs the model: a quarter of the profile's examples (ci: 10, fuzz: 200).
ENGINE_RUNS = settings(max_examples=max(5, settings.default.max_examples // 4))

VALID_PARAMS = st.fixed_dictionaries({}, optional={
    "sway_sampling_coef": st.one_of(st.none(), st.floats(-1, 1)),
    "speed": st.floats(0.1, 10),
    "fix_duration": st.one_of(st.none(), st.floats(0.01, 8)),
    "cross_fade_duration": st.floats(0, 10),
    "target_rms": st.floats(1e-6, 1, exclude_min=True),
    "method": st.sampled_from(["euler", "midpoint"]),
    "use_epss": st.booleans(),
    "remove_silence": st.booleans(),
    "tiled_decode": st.booleans(),
})
HOSTILE_PARAMS = st.dictionaries(
    st.sampled_from(["sway_sampling_coef", "speed", "fix_duration", "cross_fade_duration",
                     "target_rms", "method", "use_epss", "edit_durations", "nope"]),
    st.one_of(HOSTILE_NUMBERS, st.floats(-2, 12), st.lists(st.floats(-1, 2), max_size=2)),
    min_size=1, max_size=3)
PARAMS = mostly(VALID_PARAMS, HOSTILE_PARAMS)
STEPS = mostly(st.one_of(st.none(), st.integers(1, 3)), HOSTILE_NUMBERS)
GUIDANCE = mostly(st.one_of(st.none(), st.floats(0, 100)), HOSTILE_NUMBERS)

# Sorted, non-overlapping spans within (and a little past) the 2 s reference.
SEGMENTS = st.lists(st.floats(0, 2.5), min_size=2, max_size=6, unique=True).map(
    lambda bounds: list(zip(sorted(bounds)[::2], sorted(bounds)[1::2], strict=False)))


@ENGINE_RUNS
@given(text=TEXT, steps=STEPS, guidance=GUIDANCE, params=PARAMS,
       seed=st.one_of(st.none(), st.integers(0, 2**32 - 1)))
def test_synthesize_gives_finite_audio_or_a_named_error(engine, ref, text, steps, guidance,
                                                        params, seed):
    def call():
        return engine.synthesize(SynthesisRequest(text, reference=ref, steps=steps,
                                                  guidance=guidance, params=params, seed=seed))

    check_speaks(engine, call)


@ENGINE_RUNS
@given(text=TEXT, segments=mostly(SEGMENTS, st.lists(st.tuples(HOSTILE_NUMBERS, st.floats(-1, 3)),
                                                      max_size=3)),
       params=PARAMS, steps=STEPS)
def test_edit_gives_finite_audio_or_a_named_error(engine, ref, text, segments, params, steps):
    def call():
        request = EditRequest(ref, text, segments, steps=steps, params=params, seed=1)
        return engine.edit(request)

    check_speaks(engine, call)


@st.composite
def reference_audio(draw):
    """In-memory audio of any rate and values, or a (maybe damaged) file's bytes."""
    samples, rate = draw(reference_samples())
    if draw(st.booleans()):
        return ("audio", samples, rate)
    subtype = draw(st.sampled_from(["PCM_16", "FLOAT", "PCM_24"]))
    buffer = io.BytesIO()
    try:
        soundfile.write(buffer, samples, rate, format="WAV", subtype=subtype)
    except Exception:  # soundfile refuses some rates: that file cannot exist; use random bytes
        buffer = io.BytesIO(draw(st.binary(max_size=100)))
    data = buffer.getvalue()
    cut = draw(mostly(st.none(), st.integers(0, max(len(data) - 1, 0))))
    return ("file", data[:cut] if cut is not None else data, rate)


@ENGINE_RUNS
@given(source=reference_audio(), text=mostly(TEXT, st.none()))
def test_build_voice_and_speak_with_it(engine, tmp_path_factory, source, text):
    kind, value, rate = source
    directory = tmp_path_factory.mktemp("voice")
    try:
        if kind == "audio":
            reference = Reference(Audio(value, rate), text)
        else:
            path = directory / "ref.wav"
            path.write_bytes(value)
            reference = Reference(path, text)
        voice = engine.build_voice(reference)
    except MizuotoError as exc:
        event(f"no voice: {type(exc).__name__}")
        return
    voice = Voice.load(voice.save(directory / "voice.safetensors"))
    check_speaks(engine, lambda: engine.synthesize(SynthesisRequest("Hi there.", voice=voice,
                                                               steps=2, seed=3)))


# -- text extremes ----------------------------------------------------------------------------

def test_a_megabyte_single_line_is_refused_before_any_model_runs():
    with pytest.raises(InvalidRequest, match=f"more than {MAX_TEXT_CHARS}") as raised:
        SynthesisRequest("a" * (1 << 20))
    assert raised.value.field == "text"


@pytest.mark.parametrize("text", ["a" * 20_000, "word " * 20_000, "\u0301" * 50_000])
def test_a_very_long_line_is_cut_into_chunks_the_model_can_speak(engine, ref, text):
    """One "sentence" far longer than the model's text positions (no punctuation to split at):
    planned into chunks that each fit, every character kept; planning checks each chunk's
    positions, so nothing is refused mid-request. (Planned only: speaking 100,000 characters
    takes minutes.)"""
    request = SynthesisRequest(text, reference=ref, steps=1, seed=1)
    plan = engine._plan(request, engine.parse_params(request.params))
    assert len(plan.chunks) > 1
    assert "".join(plan.chunks).replace(" ", "") == text.replace(" ", "")


@pytest.mark.fuzz_only  # 10 s: run by `nox -s fuzz`, deselected in CI
def test_max_steps_run(engine, ref):
    from mizuoto.contracts.requests import MAX_STEPS

    result = engine.synthesize(SynthesisRequest("Hi.", reference=ref, steps=MAX_STEPS, seed=1,
                                                params={"fix_duration": 2.3}))
    assert result.applied.sampler["steps"] == MAX_STEPS
    assert bool(torch.isfinite(result.audio.samples).all())


# -- the defects fuzzing found (each was NaN audio or a bare exception) -----------------------

@pytest.mark.parametrize("fields, field", [
    ({"guidance": float("nan")}, "guidance"),            # was all-NaN audio
    ({"steps": 10**9}, "steps"),                         # was a bare ValueError
    ({"params": {"speed": float("inf")}}, "params.speed"),  # was a bare OverflowError
    ({"params": {"fix_duration": float("inf")}}, "params.fix_duration"),  # OverflowError
    ({"params": {"target_rms": float("inf")}}, "params.target_rms"),  # all-NaN audio
    ({"params": {"sway_sampling_coef": -5.0}}, "params.sway_sampling_coef"),  # ValueError
    ({"params": {"cross_fade_duration": float("inf")}}, "params.cross_fade_duration"),
])
def test_found_defects_are_named_errors(engine, ref, fields, field):
    with pytest.raises(InvalidRequest) as raised:
        engine.synthesize(SynthesisRequest("Hello there.", reference=ref, seed=1, **fields))
    assert raised.value.field == field


def test_nan_in_memory_reference_is_invalid_audio(engine):
    samples = np.full(16000, 0.1, dtype=np.float32)
    samples[100] = np.nan  # was quantised to 16-bit PCM as if it were a number
    with pytest.raises(InvalidAudio):
        engine.synthesize(SynthesisRequest("Hi.", reference=Reference(Audio(samples, 16000), "x"),
                                           steps=1, seed=1))


def test_remove_silence_never_leaves_empty_audio(engine, ref):
    result = engine.synthesize(SynthesisRequest("𐀀", reference=ref, guidance=0, seed=1,
                                                params={"remove_silence": True,
                                                        "target_rms": 1.0}))
    assert result.audio.num_samples > 0
    assert any("remove_silence" in warning for warning in result.applied.warnings)


# -- the command line on the tiny model -------------------------------------------------------

CLI_ARGS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--steps", "--guidance", "--seed"]),
              st.sampled_from(["1", "2", "0", "-1", "nan", "inf", "1e999", "1001", "2.5", "x"])),
    st.tuples(st.just("--param"), st.sampled_from(
        ["speed=inf", "speed=nan", "speed=0.5", "speed=[1", "fix_duration=1e999",
         "fix_duration=2.0", "target_rms=-1", "cross_fade_duration=nan", "method=rk4",
         "sway_sampling_coef=9", "use_epss=2", "nope=1", "=", "speed"])),
    st.tuples(st.just("--option"), st.sampled_from(
        ["compute.cpu_threads=0", "compute.cpu_threads=1", "compute.device=cuda:x",
         "engines.f5tts.variant=v9", "compute.dtype=nan"]))), max_size=3)


@settings(max_examples=max(3, settings.default.max_examples // 10),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=CLI_ARGS, text=TEXT)
def test_say_on_the_tiny_model_exits_with_a_documented_code(model_dir, ref, tmp_path, pairs,
                                                             text):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    output = tmp_path / "out.wav"
    output.unlink(missing_ok=True)
    args = ["-q", "say", "-m", str(model_dir), "--ref-audio", str(ref.audio),
            "--ref-text", ref.text, "-o", str(output), "--steps", "1",
            *[token for pair in pairs for token in pair], "--", text]
    result = CliRunner().invoke(cli, args, obj={})
    event(f"exit {result.exit_code}")
    assert result.exit_code in {0, 1, 2, 3, 4}, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        samples, rate = soundfile.read(output, dtype="float32")
        assert rate == 24000 and len(samples) and np.isfinite(samples).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_grid_that_repeats_is_a_named_error(model_dir, ref, dtype):
    """Sway sampling rounds the first points of a fine grid together in half precision: the ODE
    solver raised a bare ValueError ("t must be strictly increasing")."""
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.dtype": dtype,
                                            "compute.cpu_threads": 1})
    half = F5Engine.load(model_dir, options=options)
    with pytest.raises(InvalidRequest) as raised:
        half.synthesize(SynthesisRequest("Hi.", reference=ref, steps=100, seed=1))
    assert raised.value.field == "steps" and dtype in str(raised.value)
    grid = time_grid(100, use_epss=True, sway_sampling_coef=None, dtype=getattr(torch, dtype))
    assert bool((grid[1:] > grid[:-1]).all())  # without sway the same steps are fine
