"""Property tests: requests, references, options (mappings and TOML files), training configs and
voice files built from arbitrary values. Each is accepted with its numbers in the documented
ranges, or refused with the MizuotoError naming the field; nothing else escapes."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mizuoto import Audio, EditRequest, Options, Reference, SynthesisRequest, TrainingConfig, Voice
from mizuoto.contracts.requests import MAX_GUIDANCE, MAX_SEED, MAX_SEGMENT_SECONDS, MAX_STEPS
from mizuoto.errors import InvalidAudio, InvalidOption, InvalidRequest, MizuotoError
from mizuoto.options import MAX_CPU_THREADS

# Numbers as a hostile caller passes them: edges of every range, huge, NaN, infinite, wrong type.
EDGES = st.sampled_from([0, 1, -1, MAX_STEPS, MAX_STEPS + 1, 10**9, 10**400, MAX_SEED + 1,
                         -0.0, 0.5, 1e-300, 1e308, MAX_GUIDANCE, math.nextafter(MAX_GUIDANCE, 200),
                         float("nan"), float("inf"), float("-inf"), True, False])
NUMBERS = st.one_of(EDGES, st.integers(), st.floats(), st.booleans(), st.none())
ANYTHING = st.one_of(NUMBERS, st.text(max_size=8), st.binary(max_size=8),
                     st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                          st.integers(), max_size=2))
TEXT = st.one_of(st.text(), st.text(alphabet=st.characters(categories=["Mn", "Me", "Cf", "Zs"])),
                 st.sampled_from(["", " ", "\u200b", "\u202eabc", "👩‍👩‍👧", "a\u0301" * 50, "x" * 10_000]))


def _named(exc: MizuotoError, field: str) -> None:
    """The error names the field first (``field: problem``)."""
    assert str(exc).startswith(f"{field}: ") or str(exc).startswith(f"option {field!r}: ")


@given(text=st.one_of(TEXT, ANYTHING), seed=NUMBERS, steps=NUMBERS, guidance=NUMBERS,
       instruction=st.one_of(st.none(), TEXT, ANYTHING),
       params=st.one_of(st.none(), st.dictionaries(st.text(max_size=10), ANYTHING, max_size=3),
                        ANYTHING))
def test_synthesis_request_is_valid_or_names_the_field(text, seed, steps, guidance, instruction,
                                                        params):
    try:
        request = SynthesisRequest(text, seed=seed, steps=steps, guidance=guidance,
                                   instruction=instruction, params=params)
    except InvalidRequest as exc:
        _named(exc, exc.field)
        return
    assert isinstance(request.text, str) and request.text.strip()
    assert request.seed is None or 0 <= request.seed <= MAX_SEED
    assert request.steps is None or 1 <= request.steps <= MAX_STEPS
    assert request.guidance is None or (math.isfinite(request.guidance)
                                        and 0 <= request.guidance <= MAX_GUIDANCE)


SEGMENT = st.one_of(st.tuples(NUMBERS, NUMBERS), st.lists(NUMBERS, max_size=3), ANYTHING)


@given(text=st.one_of(TEXT, ANYTHING), reference_text=st.one_of(st.none(), TEXT),
       segments=st.one_of(st.lists(SEGMENT, max_size=4), ANYTHING), steps=NUMBERS,
       guidance=NUMBERS)
def test_edit_request_is_valid_or_names_the_field(text, reference_text, segments, steps,
                                                  guidance):
    try:
        request = EditRequest(Reference("recording.wav", reference_text), text, segments,
                              steps=steps, guidance=guidance)
    except InvalidRequest as exc:
        _named(exc, exc.field)
        return
    previous = 0.0
    for start, end in request.segments:
        assert math.isfinite(start) and math.isfinite(end)
        assert previous <= start < end <= MAX_SEGMENT_SECONDS
        previous = end


RATES = st.one_of(st.sampled_from([1, 999, 1000, 8000, 768000, 768001, 2**31, 0, -1]),
                  st.integers(), NUMBERS)
SAMPLES = st.one_of(
    st.lists(st.floats(width=32), min_size=0, max_size=64),
    st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=64),
    st.lists(st.lists(st.floats(-1, 1), min_size=2, max_size=2), max_size=4),
    ANYTHING,
)


@given(samples=SAMPLES, rate=RATES, text=st.one_of(st.none(), TEXT, ANYTHING))
def test_reference_with_in_memory_audio(samples, rate, text):
    try:
        reference = Reference(Audio(samples, rate), text)
    except InvalidRequest as exc:  # InvalidAudio is one
        _named(exc, exc.field)
        return
    audio = reference.audio
    assert bool(torch.isfinite(audio.samples).all()) and 1000 <= audio.sample_rate <= 768000


@given(audio=st.one_of(st.text(max_size=20), ANYTHING))
def test_reference_with_any_source(audio):
    try:
        Reference(audio)
    except InvalidRequest as exc:
        _named(exc, exc.field)


# -- options --------------------------------------------------------------------------------

KEYS = st.sampled_from(["compute.device", "compute.dtype", "compute.compile",
                        "compute.oom_fallback", "compute.cpu_threads", "compute.cpu_allocator",
                        "compute.cpu_pinning", "compute.attention", "compute.cuda_graphs", "compute", "engines",
                        "engines.f5tts.variant", "engines.voxcpm.dtype", "engines.fake.level",
                        "compute.nope", "other", "compute..device", ".", ""])
VALUES = st.one_of(ANYTHING, st.sampled_from(["cpu", "cuda:1", "cuda:x", "cuda:99999", "auto:0",
                                              "float16", "fast", "jemalloc"]),
                   st.dictionaries(st.text(max_size=6), ANYTHING, max_size=3))


@given(values=st.dictionaries(st.one_of(KEYS, st.text(max_size=12)), VALUES, max_size=4))
def test_options_from_mapping_are_valid_or_name_the_key(values):
    try:
        options = Options.from_mapping(values)
    except InvalidOption as exc:
        _named(exc, exc.key)
        return
    threads = options.compute.cpu_threads
    assert threads is None or 1 <= threads <= MAX_CPU_THREADS


@given(values=st.dictionaries(st.text(max_size=6), ANYTHING, max_size=3))
def test_options_with_non_string_keys(values):
    try:
        Options.from_mapping({1: values, (2,): "x", None: 3})
    except InvalidOption as exc:
        _named(exc, exc.key)


TOML_LINES = st.one_of(
    st.sampled_from(["[compute]", "[engines.f5tts]", "[engines]", "device = \"cpu\"",
                     "cpu_threads = 4", "cpu_threads = 99999999999999999999", "cpu_threads = nan",
                     "cpu_threads = inf", "compile = true", "dtype = 3", "variant = \"v1_base\"",
                     "[[compute]]", "x = [1, 2", "compute.device = \"cuda:0\"", "\x00", "= 1"]),
    st.text(alphabet=string.printable, max_size=30))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(TOML_LINES, max_size=8), raw=st.binary(max_size=64))
def test_options_toml_files_are_valid_or_name_the_key(tmp_path, lines, raw):
    path = tmp_path / "options.toml"
    for content in ("\n".join(lines).encode("utf-8", "surrogatepass"), raw):
        path.write_bytes(content)
        try:
            Options.from_toml(path)
        except InvalidOption as exc:
            _named(exc, exc.key)


@given(pairs=st.lists(st.one_of(st.text(max_size=30), st.builds(
    "{}={}".format, KEYS, st.sampled_from(["cpu", "4", "nan", "inf", "1e999", "[", "true",
                                            "\"x\"", "{a=1}", "-3", "0"]))), max_size=4))
def test_option_overrides_are_valid_or_name_the_key(pairs):
    try:
        Options().with_overrides(pairs)
    except InvalidOption as exc:
        _named(exc, exc.key)


# -- training configs -----------------------------------------------------------------------

@given(steps=NUMBERS, learning_rate=NUMBERS, batch_size=NUMBERS, seed=NUMBERS,
       save_every=NUMBERS, memory=st.one_of(st.sampled_from(["default", "low", "lowest"]),
                                            ANYTHING))
def test_training_config_is_valid_or_names_the_field(steps, learning_rate, batch_size, seed,
                                                     save_every, memory):
    try:
        config = TrainingConfig("full", "m", "data", "out", steps=steps,
                                learning_rate=learning_rate, batch_size=batch_size, seed=seed,
                                memory=memory, save_every=save_every)
    except InvalidRequest as exc:
        _named(exc, exc.field)
        return
    assert 1 <= config.steps and 1 <= config.save_every and 1 <= config.batch_size
    assert math.isfinite(config.learning_rate) and 0 < config.learning_rate <= 1


# -- voice files ----------------------------------------------------------------------------

VOICE = Voice("fake", "f" * 64, 8000, {"prompt": torch.ones(4)}, texts={"t": "hello"},
              meta={"k": 1})


@pytest.fixture(scope="module")
def voice_bytes(tmp_path_factory) -> bytes:
    return VOICE.save(tmp_path_factory.mktemp("voice") / "seed.voice").read_bytes()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_voice_load_of_damaged_files(tmp_path, voice_bytes, data):
    """A voice file cut short, with bytes flipped or replaced: loaded (it is still a voice) or
    refused with InvalidRequest; never another exception."""
    original = voice_bytes
    kind = data.draw(st.sampled_from(["truncate", "flip", "random", "header"]))
    if kind == "truncate":
        content = original[:data.draw(st.integers(0, len(original)))]
    elif kind == "flip":
        content = bytearray(original)
        for index in data.draw(st.lists(st.integers(0, len(original) - 1), min_size=1,
                                        max_size=8)):
            content[index] = data.draw(st.integers(0, 255))
        content = bytes(content)
    elif kind == "header":
        size = int.from_bytes(original[:8], "little")
        header = data.draw(st.one_of(st.binary(max_size=80), st.just(original[8:8 + size])))
        content = len(header).to_bytes(8, "little") + header + original[8 + size:]
    else:
        content = data.draw(st.binary(max_size=256))
    path = tmp_path / "damaged.voice"
    path.write_bytes(content)
    try:
        voice = Voice.load(path)
    except InvalidRequest as exc:
        _named(exc, exc.field)
        return
    assert isinstance(voice.engine, str) and isinstance(voice.sample_rate, int)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.sampled_from(["format", "engine", "model_fingerprint",
                                                "sample_rate", "texts", "meta"]),
                              st.one_of(st.text(max_size=12), st.sampled_from(
                                  ["mizuoto-voice/1", "-5", "1e9", "nan", "[]", "{", "null",
                                   "{\"a\": 1}", "99999999999999999999999"])), max_size=6))
def test_voice_load_with_any_metadata(tmp_path, header):
    from safetensors.torch import save_file

    path = tmp_path / "meta.voice"
    save_file({"prompt": torch.zeros(2)}, str(path), metadata=header)
    try:
        voice = Voice.load(path)
    except InvalidRequest as exc:
        _named(exc, exc.field)
        return
    assert voice.sample_rate > 0 and isinstance(dict(voice.texts), dict)


@pytest.mark.parametrize("value", [np.float32("nan"), np.array([[1.0]]), "abc", object()])
def test_audio_samples_that_are_not_mono_numbers(value):
    with pytest.raises(InvalidAudio):
        Audio(value, 8000)


@given(rate=RATES)
def test_audio_rate_is_a_positive_integer(rate):
    assume(not (isinstance(rate, int) and not isinstance(rate, bool) and rate > 0))
    with pytest.raises(InvalidAudio):
        Audio([0.0], rate)


@pytest.mark.parametrize("make, field", [
    (lambda: SynthesisRequest("hi", guidance=float("nan")), "guidance"),  # was NaN audio
    (lambda: SynthesisRequest("hi", steps=10**9), "steps"),  # was a bare ValueError
    (lambda: SynthesisRequest("hi", params=5), "params"),  # was a bare TypeError
    (lambda: SynthesisRequest("hi", instruction=5), "instruction"),  # was AttributeError
    (lambda: EditRequest(Reference("a.wav", "t"), "x", [(0, float("inf"))]), "segments"),
    (lambda: TrainingConfig("full", "m", "d", "o", learning_rate=float("nan")),
     "training.learning_rate"),
])
def test_found_defects_are_named_errors(make, field):
    with pytest.raises(InvalidRequest) as raised:
        make()
    assert raised.value.field == field


@pytest.mark.parametrize("values, key", [
    ({"compute.cpu_threads": 10**9}, "compute.cpu_threads"),  # was accepted
    ({"compute.device": "cuda:x"}, "compute.device"),  # was accepted, failed at load
    ({1: "x"}, "1"),  # was a bare AttributeError
])
def test_found_option_defects_are_named_errors(values, key):
    with pytest.raises(InvalidOption) as raised:
        Options.from_mapping(values)
    assert raised.value.key == key


def test_voice_with_non_finite_tensors_is_refused(tmp_path):
    voice = Voice("fake", "f" * 64, 8000, {"prompt": torch.tensor([0.0, float("nan")])})
    with pytest.raises(InvalidRequest, match="NaN or infinite"):
        Voice.load(voice.save(tmp_path / "nan.voice"))


def test_empty_in_memory_reference_is_invalid_audio():
    # VoxCPM's first generation resampled it and crashed in the kernel's reshape
    with pytest.raises(InvalidAudio, match="no samples"):
        Reference(Audio([], 16000), "text")
