# Long on purpose: the API contract every engine meets, in sections (every model, references,
# other capabilities, hostile input); behaviour, plugin and trainer contracts are modules apart.
"""The contract every engine meets, run against each installed contract fixture.

    pytest --pyargs mizuoto_contract [--mizuoto-engine NAME ...]

Each test takes ``contract_model`` (see :mod:`mizuoto_contract.plugin`); tests marked
``mizuoto_requires`` exist only for models that declare those capabilities.
"""

from __future__ import annotations

import threading

import attrs
import pytest
import torch

import mizuoto
from mizuoto import (
    Applied,
    AudioChunk,
    Capability,
    EditRequest,
    Reference,
    SynthesisRequest,
    SynthesisResult,
    Voice,
)
from mizuoto.contracts.engine import NO_OP_COMPUTE
from mizuoto.contracts.requests import MAX_SEED
from mizuoto.errors import (
    InvalidAudio,
    InvalidOption,
    InvalidRequest,
    MizuotoError,
    NonFiniteAudio,
    RequestConflict,
    UnsupportedCapability,
    VoiceMismatch,
)
from mizuoto.options import ComputeOptions, Options
from mizuoto.registry import get_engine
from mizuoto.runtime.allocator import loaded_allocator
from mizuoto_contract.compare import assert_same, first_differing_tensor
from mizuoto_contract.models import CONTRACT_OPTIONS, ContractModel
from mizuoto_contract.reference import REFERENCE_TEXT, other_reference, write_silence
from mizuoto_contract.versions import require as _require

TEXT = "Hello there, this is a contract test."
EDITED_TEXT = "A steady voice reads that line."
INSTRUCTION = "A calm, low voice, speaking slowly."
OTHER_INSTRUCTION = "A bright, young voice, speaking fast and cheerfully."
# Twelve sentences, about 700 characters: long enough that engines split it into chunks.
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long text, read aloud in one request, chunk by chunk."
    for n in range(1, 13))
SEED = 1234
DTYPES = ("float32", "float16", "bfloat16")

requires = pytest.mark.mizuoto_requires


# -- helpers ----------------------------------------------------------------------------------

def _request(model: ContractModel, **fields) -> SynthesisRequest:
    """A request with the fixture's fast settings; ``fields`` override or add."""
    fields.setdefault("text", TEXT)
    fields.setdefault("steps", model.fixture.steps)
    fields.setdefault("params", model.fixture.request_params)
    return SynthesisRequest(**fields)


def _reference(model: ContractModel, text: str | None = REFERENCE_TEXT) -> Reference:
    return Reference(model.reference_path, text=text)


def _global_rng(model: ContractModel, request: SynthesisRequest, stream: bool = False):
    """A diagnosis for :func:`assert_same`: whether ``request``'s audio follows torch's global
    RNG (the same under one ``torch.manual_seed``, other under another), which would make the
    generator the base class passes unused."""
    def run(global_seed: int) -> torch.Tensor:
        torch.manual_seed(global_seed)
        if stream:
            return _joined(model.engine.stream(request))
        return model.engine.synthesize(request).audio.samples

    def diagnose() -> str | None:
        state = torch.get_rng_state()
        try:
            once, again, other = run(0), run(0), run(1)
        finally:
            torch.set_rng_state(state)
        if torch.equal(once, again) and not torch.equal(once, other):
            return ("the given generator is not used: the audio follows torch's global RNG "
                    f"(torch.manual_seed changes {'the stream' if stream else 'it'}); draw "
                    "only from the generator passed to _synthesize/_stream "
                    "(torch.randn(..., generator=generator))")
        return None

    return diagnose


def _plain_request(model: ContractModel, **fields) -> SynthesisRequest:
    """The simplest request the model accepts: zero-shot, else cloning, else a designed voice."""
    capabilities = model.engine.capabilities
    if Capability.ZERO_SHOT not in capabilities:
        if Capability.CLONE in capabilities:
            fields.setdefault("reference", _reference(model))
        else:
            fields.setdefault("instruction", INSTRUCTION)
    return _request(model, **fields)


def _in_threads(calls, what: str) -> list:
    """Run each of ``calls`` in its own thread, all at once; their results in order (an
    exception in any thread fails the test, in the test's thread)."""
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, f"{what} failed: {errors[0]!r}"
    return [results[index] for index in range(len(calls))]


def _check_result(model: ContractModel, result: SynthesisResult, *, seed: int | None = None
                  ) -> None:
    """Audio is sane (see ``_check_audio``) and not silent; ``applied`` describes this run."""
    assert isinstance(result, SynthesisResult), "synthesize/edit must return a SynthesisResult"
    _check_audio(model, result.audio, "the result's audio")
    _check_not_silent(result.audio.samples, "the result's audio")
    _check_no_dc_offset(model, result.audio.samples, "the result's audio")
    _check_applied(model, result.applied, seed=seed)


# Speech, music and noise swing around zero: a mean this far from it, and larger than the
# signal's own swing, is a constant added to every sample (a bias, an offset, unsigned PCM).
DC_LIMIT = 0.05


def _check_no_dc_offset(model: ContractModel, samples: torch.Tensor, what: str) -> None:
    values = samples.double()
    mean, swing = float(values.mean()), float(values.std()) if values.numel() > 1 else 0.0
    _require(abs(mean) <= DC_LIMIT or abs(mean) <= swing, (
        f"{what} has a DC offset: its mean is {mean:.3g} (limit {DC_LIMIT}) against a swing "
        f"(standard deviation) of {swing:.3g}. Likely cause: a constant added to every sample "
        f"(a bias, unsigned PCM read as signed, an offset left in a vocoder); remove it so "
        f"the samples swing around zero"))


# Full scale: a sample at or beyond 0.999 counts as clipped; more than this share of them is a
# clipped signal, not a loud one.
CLIPPED_SHARE = 0.01
SILENT_RMS = 1e-5


def _check_audio(model: ContractModel, audio, what: str) -> None:
    """Mono float32 at the declared rate, finite, within full scale and not clipped."""
    info = model.engine.info
    samples = audio.samples
    assert samples.ndim == 1 and samples.dtype == torch.float32, \
        f"{what} must be mono float32: build it with mizuoto.Audio(samples, rate)"
    assert audio.sample_rate == info.sample_rate, (
        f"{what} is at {audio.sample_rate} Hz but ModelInfo.sample_rate says "
        f"{info.sample_rate} Hz: return audio at the rate the model declares")
    assert bool(torch.isfinite(samples).all()), \
        f"{what} has NaN or infinite samples: an engine must never return them"
    if samples.numel() == 0 or model.fixture.may_exceed_full_scale:
        return
    peak = float(samples.abs().max())
    assert peak <= 1.0, (
        f"{what} peaks at {peak:.4g}, beyond full scale (1.0): samples are floats in [-1, 1] "
        f"(scale integer PCM by its range, e.g. int16 / 32768); an engine whose upstream "
        f"returns louder audio declares it with ContractFixture(may_exceed_full_scale=True)")
    clipped = float((samples.abs() >= 0.999).float().mean())
    assert clipped <= CLIPPED_SHARE, (
        f"{clipped:.1%} of {what} sits at full scale: the signal is clipped; scale it into "
        f"[-1, 1] instead of clamping it")


def _check_not_silent(samples: torch.Tensor, what: str) -> None:
    assert samples.numel() > 0, f"{what} is empty: a non-empty text must give audio"
    rms = float(samples.double().pow(2).mean().sqrt())
    assert rms > SILENT_RMS, f"{what} is silent (RMS {rms:.2g}) for a non-empty text"


def _check_applied(model: ContractModel, applied: Applied, *, seed: int | None) -> None:
    info = model.engine.info
    assert isinstance(applied, Applied)
    assert (applied.engine, applied.model) == (info.engine, info.model)
    assert (applied.dtype, applied.device) == (info.dtype, info.device)
    assert 0 <= applied.seed <= MAX_SEED, "applied.seed must be the 32-bit seed used"
    assert (applied.license, applied.non_commercial) == (info.license, info.non_commercial), (
        "applied.license and applied.non_commercial must repeat the model's "
        "(ModelInfo.license, ModelInfo.non_commercial): copy them into Applied(...)")
    if seed is not None:
        assert applied.seed == seed and applied.seed_drawn is False, (
            "a seeded request must report applied.seed == request.seed and seed_drawn=False")
    in_effect = {"cpu_threads": torch.get_num_threads(),
                 "cpu_allocator": loaded_allocator() or "default"}
    assert {key: applied.compute.get(key) for key in in_effect} == in_effect, (
        "applied.compute must report the CPU settings in effect: build it with "
        "mizuoto.runtime.in_effect.compute_in_effect(**your_options)")


# -- every model ------------------------------------------------------------------------------

def test_loads_with_valid_info(contract_model: ContractModel) -> None:
    fixture, engine = contract_model.fixture, contract_model.engine
    info = engine.info
    assert type(engine) is get_engine(fixture.engine), (
        f"the fixture's model loads as {type(engine).__name__}, not the registered "
        f"{fixture.engine!r} engine. Likely cause: load() returns another class's instance; "
        f"return cls(...)")
    assert info.engine == engine.name == fixture.engine, (
        f"ModelInfo.engine is {info.engine!r}, the engine's name {engine.name!r}, the fixture's "
        f"{fixture.engine!r}. Likely cause: ModelInfo built by hand with another name; build "
        f"it with placement.model_info(...)")
    assert info.model == f"contract/{fixture.id}", "ModelInfo.model must be the model_id given"
    assert isinstance(info.variant, str)
    assert isinstance(info.sample_rate, int) and info.sample_rate > 0
    assert info.dtype in DTYPES, (
        f"ModelInfo.dtype is {info.dtype!r}, not one of {DTYPES}. Likely cause: a torch.dtype "
        f"or its repr stored; report its name (placement.model_info does)")
    assert info.device == "cpu", "the suite loads with compute.device=cpu"
    assert isinstance(info.capabilities, frozenset)
    assert all(isinstance(c, Capability) for c in info.capabilities)
    assert info.capabilities & {Capability.ZERO_SHOT, Capability.CLONE, Capability.DESIGN}, \
        "a model must be able to speak: zero-shot, cloning or voice design"
    assert info.license is None or isinstance(info.license, str)
    assert isinstance(info.non_commercial, bool)
    if Capability.VOICE_CACHE in info.capabilities:
        assert info.fingerprint, "voices are checked against the fingerprint: it cannot be empty"


# a value other than the default for each compute option (see mizuoto.options.ComputeOptions)
_NON_DEFAULT_COMPUTE = {"compile": True, "oom_fallback": False, "cpu_threads": 1,
                        "cpu_allocator": "jemalloc", "cpu_pinning": True, "attention": "fast",
                        "cpu_wait_policy": "passive",
                        "cuda_graphs": True, "prepack": "off",
                        "device": "cpu", "dtype": "float32"}


def test_unimplemented_compute_options_are_refused(contract_model: ContractModel) -> None:
    """An option the engine does not implement is never silently ignored: set to a non-default
    value it is refused at load, naming the option and the engine; a value that means doing
    nothing (``compute.prepack=off``) is accepted and reported."""
    engine_cls = type(contract_model.engine)
    assert set(_NON_DEFAULT_COMPUTE) == {f.name for f in attrs.fields(ComputeOptions)}
    for name, value in _NON_DEFAULT_COMPUTE.items():
        if name in engine_cls.compute_options:
            continue
        options = Options.from_mapping({"compute": {"device": "cpu", name: value}})
        if NO_OP_COMPUTE.get(name) == value:  # accepted by every engine, and reported
            engine_cls.check_compute(options)
            assert name in contract_model.engine.compute_in_effect(), (
                f"applied.compute must report compute.{name}: build it with the base "
                "class's Engine.compute_in_effect()")
            continue
        with pytest.raises(InvalidOption) as caught:
            mizuoto.load(contract_model.directory, engine=engine_cls.name, options=options)
        assert caught.value.key == f"compute.{name}" and engine_cls.name in str(caught.value), (
            f"refusing compute.{name} named {caught.value.key!r}: {caught.value}. Likely cause: "
            f"a refusal of your own; leave it to the base class (declare compute_options)")
        with pytest.raises(InvalidOption):
            engine_cls.load(contract_model.directory, options=options)


def test_seeded_synthesis_is_deterministic(contract_model: ContractModel) -> None:
    request = _plain_request(contract_model, seed=SEED)
    first = contract_model.engine.synthesize(request)
    second = contract_model.engine.synthesize(request)
    _check_result(contract_model, first, seed=SEED)
    _check_result(contract_model, second, seed=SEED)
    assert_same(second.audio.samples, first.audio.samples,
                "two runs of the same seeded request", "the engine draws from an unseeded or global generator (draw only from the generator the base class passes), or keeps state from one request to the next",
                _global_rng(contract_model, request))


def test_concurrent_requests_match_sequential(contract_model: ContractModel) -> None:
    """Two threads sharing one loaded engine: no crash, no mixed state, and each result equals
    the same request run alone (an engine may serialize; the base class does by default)."""
    engine = contract_model.engine
    requests = [_plain_request(contract_model, seed=SEED),
                _plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT)]
    alone = [engine.synthesize(request).audio.samples for request in requests]
    together = _in_threads([lambda r=r: engine.synthesize(r).audio.samples for r in requests],
                           "concurrent synthesize")
    for index, expected in enumerate(alone):
        assert_same(together[index], expected, f"request {index} run concurrently and alone",
                    "per-request state shared between threads: an engine that declares "
                    "takes_turns_per='chunk' (or concurrent_requests=True) must keep every "
                    "request's state in its own call",
                    _global_rng(contract_model, requests[index]))


def test_unseeded_synthesis_reports_its_seed(contract_model: ContractModel) -> None:
    drawn = contract_model.engine.synthesize(_plain_request(contract_model))
    _check_result(contract_model, drawn)
    assert drawn.applied.seed_drawn is True, (
        "an unseeded request must report seed_drawn=True and the seed it drew: draw it with "
        "mizuoto.runtime.seeds.resolve_seed(request.seed)")
    replay = contract_model.engine.synthesize(_plain_request(contract_model,
                                                             seed=drawn.applied.seed))
    _check_result(contract_model, replay, seed=drawn.applied.seed)
    assert_same(replay.audio.samples, drawn.audio.samples,
                "an unseeded result and its replay with applied.seed",
                "applied.seed is not the seed the audio was drawn with")


def test_unknown_param_is_named(contract_model: ContractModel) -> None:
    params = {**contract_model.fixture.request_params, "no_such_setting": 1}
    with pytest.raises(InvalidRequest) as raised:
        contract_model.engine.synthesize(_plain_request(contract_model, params=params))
    assert "no_such_setting" in raised.value.field, (
        f"an unknown param was refused naming {raised.value.field!r}. Likely cause: params "
        f"parsed by hand; use Engine.parse_params (the base class does), which names it")


def test_unsupported_capability_raises(contract_model: ContractModel,
                                       lacking_capability: Capability) -> None:
    engine = contract_model.engine
    with pytest.raises(UnsupportedCapability):
        if lacking_capability is Capability.ZERO_SHOT:
            engine.synthesize(_request(contract_model, seed=SEED))
        elif lacking_capability is Capability.CLONE:
            engine.synthesize(_request(contract_model, reference=_reference(contract_model),
                                       seed=SEED))
        elif lacking_capability is Capability.DESIGN:
            engine.synthesize(_plain_request(contract_model, instruction=INSTRUCTION, seed=SEED))
        elif lacking_capability is Capability.EDIT:
            engine.edit(EditRequest(_reference(contract_model), EDITED_TEXT, [(0.2, 0.5)],
                                    seed=SEED, steps=contract_model.fixture.steps,
                                    params=contract_model.fixture.request_params))
        elif lacking_capability is Capability.STREAM:
            next(iter(engine.stream(_plain_request(contract_model, seed=SEED))))
        elif lacking_capability is Capability.VOICE_CACHE:
            engine.build_voice(_reference(contract_model))


@pytest.mark.parametrize("text", ["?!… —", "\u200b\u200d\u2060", "🙂🙂"])
def test_text_without_words_is_spoken_or_refused_by_name(contract_model: ContractModel,
                                                          text: str) -> None:
    """Text core accepts but that holds no words reaches the engine: it must give sane audio
    or raise a named MizuotoError (InvalidRequest naming "text"), never crash."""
    try:
        result = contract_model.engine.synthesize(_plain_request(contract_model, text=text,
                                                                 seed=SEED))
    except MizuotoError:
        return
    assert isinstance(result, SynthesisResult)
    _check_audio(contract_model, result.audio, f"the audio for {text!r}")
    _check_applied(contract_model, result.applied, seed=SEED)


def _duration(result: SynthesisResult) -> float:
    return result.audio.num_samples / result.audio.sample_rate


# Four times the text must give at least this many times the audio (a model's pauses and
# prompt handling leave room; a cut text gives about 1).
GROWTH = 2.0


@requires(when=lambda fixture: fixture.length_follows_text)
def test_longer_text_gives_longer_audio_or_is_refused_by_name(contract_model: ContractModel
                                                             ) -> None:
    """A text several times longer gives several times more audio, or is refused naming
    ``text``: never silently cut. (Not generated for a fixture that says its length does not
    follow the text: ``ContractFixture.length_follows_text``.)"""
    times = 4
    short = contract_model.engine.synthesize(_plain_request(contract_model, seed=SEED))
    longer_text = " ".join([TEXT] * times)
    try:
        longer = contract_model.engine.synthesize(_plain_request(contract_model,
                                                                 text=longer_text, seed=SEED))
    except InvalidRequest as exc:
        assert exc.field == "text", f"a refused long text must name the field text: {exc}"
        return
    ratio = _duration(longer) / max(_duration(short), 1e-9)
    _require(ratio >= GROWTH, (
        f"a text {times} times longer gave {ratio:.2f} times the audio ({_duration(short):.2f} "
        f"s -> {_duration(longer):.2f} s). Likely cause: the text is cut (e.g. text[:n]) or a "
        f"length cap ends the audio; speak it whole (split it into chunks) or refuse it with "
        f"InvalidRequest('text', ...) naming the limit"))


@pytest.mark.parametrize(("setting", "values"), [("steps", (2, 5)), ("guidance", (1.0, 3.0))])
def test_sampler_settings_change_the_audio_or_are_refused(contract_model: ContractModel,
                                                          setting: str, values) -> None:
    """``request.steps`` and ``request.guidance`` change the audio, or are refused naming the
    field (an engine without them declares ``request_settings``): never silently ignored."""
    results = []
    for value in values:
        fields = {setting: value}
        if setting == "guidance":
            fields["steps"] = contract_model.fixture.steps
        try:
            results.append(contract_model.engine.synthesize(
                _plain_request(contract_model, seed=SEED, **fields)))
        except InvalidRequest as exc:
            assert exc.field == setting, f"refusing {setting} must name it: {exc}"
            return
    _require(not torch.equal(results[0].audio.samples,
                                             results[1].audio.samples), (
        f"request.{setting}={values[0]} and {values[1]} gave the same audio: the engine "
        f"ignores {setting}. Use it, or refuse it: declare request_settings without "
        f"{setting!r} (the base class then raises InvalidRequest naming it)"))


# The rates audio is made at. Another one is possible, but more often a slip (samples per
# hop, a sum of rates); and a model whose own rate differs from the label cannot be told
# from its samples (random-init audio is noise of any bandwidth), only from its duration.
COMMON_RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)


def test_sample_rate_is_plausible(contract_model: ContractModel) -> None:
    """What can be checked honestly: the declared rate is a common audio rate, and, where the
    fixture knows its model's duration rule (``seconds_per_character``), the duration at the
    declared rate is in range, which catches samples made at one rate and labelled another.
    A relabelled model without a known duration rule cannot be caught from its samples."""
    rate = contract_model.engine.info.sample_rate
    _require(rate in COMMON_RATES, (
        f"ModelInfo.sample_rate is {rate} Hz, not a common audio rate "
        f"({', '.join(map(str, COMMON_RATES))}): check that it is the rate the samples are "
        f"made at"))
    expected = contract_model.fixture.seconds_per_character
    if expected is None:
        return
    result = contract_model.engine.synthesize(_plain_request(contract_model, seed=SEED))
    per_character = _duration(result) / len(TEXT)
    low, high = expected
    assert low <= per_character <= high, (
        f"{per_character:.4g} s per character at the declared {rate} Hz, outside the fixture's "
        f"{low:g}-{high:g}. Likely cause: samples made at another rate and labelled "
        f"{rate} Hz (resample them, or declare the rate they are made at)")


@requires(Capability.STREAM)
def test_a_request_during_a_stream_leaves_both_unchanged(contract_model: ContractModel
                                                         ) -> None:
    """``it = engine.stream(a); next(it); engine.synthesize(b); rest = list(it)``: ``a``
    equals ``a`` streamed alone and ``b`` equals ``b`` alone, or ``b`` is refused with
    RequestConflict (the base class does for an engine that takes turns per request)."""
    engine = contract_model.engine
    first = _plain_request(contract_model, seed=SEED)
    second = _plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT)
    alone = torch.cat([c.audio.samples for c in engine.stream(first)])
    second_alone = engine.synthesize(second).audio.samples
    chunks = iter(engine.stream(first))
    opening = next(chunks)
    try:
        during = engine.synthesize(second).audio.samples
    except RequestConflict:
        during = None
    joined = torch.cat([opening.audio.samples, *(c.audio.samples for c in chunks)])
    assert_same(joined, alone, "a stream with a request run during it, and the stream alone",
                "the request walked into the stream's state: keep it per request, or declare "
                "takes_turns_per='request' so that the base class refuses the request")
    if during is not None:
        assert_same(during, second_alone, "a request run during a stream, and alone",
                    "the open stream's state leaked into the request")


# -- references (cloning) ---------------------------------------------------------------------

@requires(Capability.CLONE)
def test_clone(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model), seed=SEED)
    result = contract_model.engine.synthesize(request)
    _check_result(contract_model, result, seed=SEED)
    assert_same(contract_model.engine.synthesize(request).audio.samples, result.audio.samples,
                "two runs of the same seeded cloning request", "the engine draws from an unseeded or global generator (draw only from the generator the base class passes), or keeps state from one request to the next")


@requires(Capability.CLONE, when=lambda fixture: fixture.needs_reference_text)
def test_clone_without_reference_text_is_refused(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model, text=None), seed=SEED)
    with pytest.raises(InvalidRequest) as raised:
        contract_model.engine.synthesize(request)
    assert raised.value.field.startswith("reference"), (
        f"a bad reference was refused naming {raised.value.field!r}. Likely cause: the "
        f"recording read by hand; read it with mizuoto.plugin.read_reference, which names "
        f"reference.audio")


@requires(Capability.CLONE, when=lambda fixture: not fixture.needs_reference_text)
def test_clone_without_reference_text(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model, text=None), seed=SEED)
    _check_result(contract_model, contract_model.engine.synthesize(request), seed=SEED)


@requires(Capability.CLONE)
def test_missing_reference_file_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    reference = Reference(tmp_path / "no-such-recording.wav", text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference"), (
        f"a bad reference was refused naming {raised.value.field!r}. Likely cause: the "
        f"recording read by hand; read it with mizuoto.plugin.read_reference, which names "
        f"reference.audio")


@requires(Capability.CLONE)
def test_unreadable_reference_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    path = tmp_path / "not-audio.wav"
    path.write_bytes(b"RIFF, but not really a WAV file" * 8)
    reference = Reference(path, text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference"), (
        f"a bad reference was refused naming {raised.value.field!r}. Likely cause: the "
        f"recording read by hand; read it with mizuoto.plugin.read_reference, which names "
        f"reference.audio")


@requires(Capability.CLONE)
def test_silent_reference_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    path = write_silence(tmp_path / "silence.wav", contract_model.engine.info.sample_rate)
    reference = Reference(path, text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference"), (
        f"a bad reference was refused naming {raised.value.field!r}. Likely cause: the "
        f"recording read by hand; read it with mizuoto.plugin.read_reference, which names "
        f"reference.audio")


# -- other capabilities -----------------------------------------------------------------------

@requires(Capability.ZERO_SHOT)
def test_zero_shot(contract_model: ContractModel) -> None:
    result = contract_model.engine.synthesize(_request(contract_model, seed=SEED))
    _check_result(contract_model, result, seed=SEED)


@requires(Capability.DESIGN)
def test_design(contract_model: ContractModel) -> None:
    request = _request(contract_model, instruction=INSTRUCTION, seed=SEED)
    result = contract_model.engine.synthesize(request)
    _check_result(contract_model, result, seed=SEED)
    assert_same(contract_model.engine.synthesize(request).audio.samples, result.audio.samples,
                "two runs of the same seeded design request", "the engine draws from an unseeded or global generator (draw only from the generator the base class passes), or keeps state from one request to the next")
    other = contract_model.engine.synthesize(attrs.evolve(request, instruction=OTHER_INSTRUCTION))
    assert not torch.equal(result.audio.samples, other.audio.samples), (
        "two instructions gave the same audio with the same seed: a model that declares "
        "DESIGN must use request.instruction")


@requires(Capability.EDIT)
def test_edit(contract_model: ContractModel) -> None:
    request = EditRequest(_reference(contract_model), EDITED_TEXT, [(0.2, 0.5)], seed=SEED,
                          steps=contract_model.fixture.steps,
                          params=contract_model.fixture.request_params)
    result = contract_model.engine.edit(request)
    _check_result(contract_model, result, seed=SEED)
    assert_same(contract_model.engine.edit(request).audio.samples, result.audio.samples,
                "two runs of the same seeded edit", "the engine draws from an unseeded or global generator (draw only from the generator the base class passes), or keeps state from one request to the next")


@requires(Capability.LONG_TEXT)
def test_long_text(contract_model: ContractModel) -> None:
    request = _plain_request(contract_model, text=LONG_TEXT, seed=SEED)
    result = contract_model.engine.synthesize(request)
    _check_result(contract_model, result, seed=SEED)
    assert result.applied.chunks >= 1
    assert_same(contract_model.engine.synthesize(request).audio.samples, result.audio.samples,
                "two runs of the same seeded long text", "the engine draws from an unseeded or global generator (draw only from the generator the base class passes), or keeps state from one request to the next")


def _stream(model: ContractModel, request: SynthesisRequest) -> list[AudioChunk]:
    chunks = list(model.engine.stream(request))
    assert chunks, "a stream yields at least one chunk"
    for position, chunk in enumerate(chunks):
        assert isinstance(chunk, AudioChunk)
        assert chunk.index == position and chunk.is_last == (position == len(chunks) - 1), (
            f"stream chunk {position} of {len(chunks)} has index {chunk.index}, is_last "
            f"{chunk.is_last}. Likely cause: a stream that numbers its own chunks; yield "
            f"Rendered pieces from _stream (the base class numbers them), last=True on the last")
        assert (chunk.applied is not None) == chunk.is_last, "only the last chunk has applied"
        # audio is never held back to mark the last chunk: it may be empty instead
        assert chunk.is_last or chunk.audio.num_samples > 0, "only the last chunk may be empty"
        _check_audio(model, chunk.audio, f"stream chunk {position}")
    _check_not_silent(torch.cat([c.audio.samples for c in chunks]), "the streamed audio")
    return chunks


@requires(Capability.STREAM)
def test_stream_chunks_arrive_in_order(contract_model: ContractModel) -> None:
    chunks = _stream(contract_model, _plain_request(contract_model, seed=SEED))
    _check_applied(contract_model, chunks[-1].applied, seed=SEED)
    joined = torch.cat([chunk.audio.samples for chunk in chunks])
    assert joined.numel() > 0 and bool(torch.isfinite(joined).all())


@requires(Capability.STREAM, when=lambda fixture: fixture.stream_matches)
def test_stream_matches_synthesis(contract_model: ContractModel) -> None:
    request = _plain_request(contract_model, seed=SEED)
    joined = torch.cat([chunk.audio.samples for chunk in _stream(contract_model, request)])
    assert_same(joined, contract_model.engine.synthesize(request).audio.samples,
                "the joined stream and the synthesized audio",
                "the chunks are not consecutive pieces of the same audio (other noise draws, "
                "overlap or padding at the joins); a fixture whose engine differs on purpose "
                "sets stream_matches=False", _global_rng(contract_model, request, stream=True))


def _joined(chunks) -> torch.Tensor:
    return torch.cat([chunk.audio.samples for chunk in chunks])


@requires(Capability.STREAM)
def test_a_stream_opened_during_a_stream_leaves_both_unchanged(
        contract_model: ContractModel) -> None:
    """``it = stream(a); next(it); list(stream(b)); rest = list(it)``, one thread: ``a`` and
    ``b`` each equal their streams alone, or ``b`` is refused with RequestConflict, which only
    an engine that takes turns per request may do."""
    engine = contract_model.engine
    first = _plain_request(contract_model, seed=SEED)
    second = _plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT)
    alone = _joined(_stream(contract_model, first))
    second_alone = _joined(_stream(contract_model, second))
    chunks = iter(engine.stream(first))
    opening = next(chunks)
    try:
        during = _joined(engine.stream(second))
    except RequestConflict:
        assert engine.takes_turns_per == "request" and not engine.concurrent_requests, (
            "an engine whose requests run at once (takes_turns_per='chunk' or "
            "concurrent_requests) refused a second stream")
        during = None
    assert_same(_joined([opening, *chunks]), alone,
                "a stream with another stream run during it, and the stream alone",
                "the second stream walked into the first one's state")
    if during is not None:
        assert_same(during, second_alone, "a stream run during another one, and alone",
                    "the open stream's state leaked into the second one")


@requires(Capability.STREAM)
def test_streams_from_two_threads_match_each_alone(contract_model: ContractModel) -> None:
    """Two threads stream from one loaded engine, chunk by chunk (an engine may interleave
    them or serialize them): each stream equals the same stream alone."""
    engine = contract_model.engine
    requests = [_plain_request(contract_model, seed=SEED),
                _plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT)]
    alone = [_joined(_stream(contract_model, request)) for request in requests]
    together = _in_threads([lambda r=r: _joined(engine.stream(r)) for r in requests],
                           "concurrent streams")
    for index, expected in enumerate(alone):
        assert_same(together[index], expected, f"stream {index} run concurrently and alone",
                    "per-request state shared between threads",
                    _global_rng(contract_model, requests[index], stream=True))


@requires(Capability.STREAM)
def test_unseeded_stream_reports_its_seed(contract_model: ContractModel) -> None:
    chunks = _stream(contract_model, _plain_request(contract_model))
    applied = chunks[-1].applied
    _check_applied(contract_model, applied, seed=None)
    assert applied.seed_drawn is True, (
        "an unseeded stream reports seed_drawn=False. Likely cause: the seed resolved by hand; "
        "let the base class resolve it (mizuoto.runtime.seeds.resolve_seed)")
    replay = _stream(contract_model, _plain_request(contract_model, seed=applied.seed))
    assert_same(torch.cat([c.audio.samples for c in replay]),
                torch.cat([c.audio.samples for c in chunks]),
                "an unseeded stream and its replay with applied.seed",
                "the last chunk's applied.seed is not the seed the stream was drawn with",
                _global_rng(contract_model, _plain_request(contract_model, seed=applied.seed),
                            stream=True))


@requires(Capability.VOICE_CACHE)
def test_saved_voice_speaks_like_its_reference(contract_model: ContractModel, tmp_path) -> None:
    engine, info = contract_model.engine, contract_model.engine.info
    reference = _reference(contract_model)
    voice = engine.build_voice(reference)
    assert (voice.engine, voice.model_fingerprint) == (info.engine, info.fingerprint)
    path = voice.save(tmp_path / "voice.safetensors")
    loaded = Voice.load(path)
    assert (loaded.engine, loaded.model_fingerprint) == (voice.engine, voice.model_fingerprint)
    assert set(loaded.tensors) == set(voice.tensors), (
        f"a saved voice loads with tensors {sorted(loaded.tensors)}, built with "
        f"{sorted(voice.tensors)}. Likely cause: non-tensor values in Voice.tensors; keep them "
        f"plain CPU tensors (texts and metadata go in texts= and meta=)")
    differs = first_differing_tensor(dict(loaded.tensors), dict(voice.tensors))
    assert differs is None, (f"a voice saved and loaded differs from the built one: {differs}; "
                             "Voice.tensors must be plain CPU tensors that safetensors keeps")
    by_voice = engine.synthesize(_request(contract_model, voice=loaded, seed=SEED))
    by_reference = engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    _check_result(contract_model, by_voice, seed=SEED)
    assert_same(by_voice.audio.samples, by_reference.audio.samples,
                "speaking with a saved voice and with its reference",
                "build_voice keeps less than a request with the reference uses (or prepares "
                "it differently); the voice must hold exactly what the reference gives",
                lambda: _voice_ignored(contract_model, by_voice.audio.samples))


def _voice_ignored(model: ContractModel, by_voice: torch.Tensor) -> str | None:
    """A diagnosis: a voice built from another reference speaks exactly as ``by_voice``
    (the suite's reference's voice), so synthesis does not use the voice at all."""
    engine = model.engine
    other = engine.build_voice(other_reference(engine.info.sample_rate))
    if torch.equal(engine.synthesize(_request(model, voice=other, seed=SEED)).audio.samples,
                   by_voice):
        return ("synthesis ignores request.voice: a voice built from another reference "
                "gives the same audio (build_voice is not at fault); read the voice's tensors "
                "in _synthesize/_stream as the reference would be")
    return None


@requires(Capability.VOICE_CACHE)
def test_voice_of_another_model_is_refused(contract_model: ContractModel) -> None:
    engine, info = contract_model.engine, contract_model.engine.info
    voice = engine.build_voice(_reference(contract_model))
    other_model = attrs.evolve(voice, model_fingerprint="0" * 64 if info.fingerprint != "0" * 64
                               else "1" * 64)
    other_engine = attrs.evolve(voice, engine=f"not-{info.engine}")
    for foreign in (other_model, other_engine):
        with pytest.raises(VoiceMismatch):
            engine.synthesize(_request(contract_model, voice=foreign, seed=SEED))


# -- hostile input ----------------------------------------------------------------------------

def _numeric_params(engine) -> list[str]:
    """The engine's request params that hold numbers (by default value or annotation)."""
    if engine.params_class is None:
        return []
    names = []
    for field in attrs.fields(engine.params_class):
        default, kind = field.default, str(field.type)
        number = isinstance(default, (int, float)) and not isinstance(default, bool)
        if number or kind in ("int", "float", "int | None", "float | None"):
            names.append(field.name)
    return names


def test_non_finite_numbers_are_refused(contract_model: ContractModel) -> None:
    """NaN is never a setting: request fields and every numeric param refuse it, naming the
    field. Infinite and huge values are refused or give finite audio."""
    for field in ("steps", "guidance"):
        for value in (float("nan"), float("inf"), 10**400):
            with pytest.raises(InvalidRequest) as raised:
                SynthesisRequest(TEXT, **{field: value})
            assert raised.value.field == field
    base = contract_model.fixture.request_params
    for name in _numeric_params(contract_model.engine):
        for value in (float("nan"), float("inf"), float("-inf"), 10**400):
            request = _plain_request(contract_model, seed=SEED, params={**base, name: value})
            try:
                result = contract_model.engine.synthesize(request)
            except InvalidRequest as exc:
                assert exc.field.startswith("params"), exc.field
            else:
                assert value == value, f"params.{name}=nan was accepted"
                _check_result(contract_model, result, seed=SEED)


def _poison(engine) -> int:
    """Set every floating-point weight the engine holds (modules and tensors among its
    attributes) to NaN; returns how many tensors were poisoned."""
    poisoned = 0
    with torch.no_grad():
        for value in vars(engine).values():
            tensors = []
            if isinstance(value, torch.nn.Module):
                tensors = [*value.parameters(), *value.buffers()]
            elif isinstance(value, torch.Tensor):
                tensors = [value]
            for tensor in tensors:
                if tensor.is_floating_point():
                    tensor.fill_(float("nan"))
                    poisoned += 1
    return poisoned


def test_non_finite_audio_is_never_returned(contract_model: ContractModel) -> None:
    """With NaN weights, synthesis (and streaming) raises NonFiniteAudio naming the stage; no
    NaN audio comes back."""
    fixture = contract_model.fixture
    engine = get_engine(fixture.engine).load(contract_model.directory, options=CONTRACT_OPTIONS,
                                             model_id=f"contract/{fixture.id}")
    if not _poison(engine):
        pytest.skip("the engine holds no torch weights among its attributes to poison")
    with pytest.raises(NonFiniteAudio) as raised:
        engine.synthesize(_plain_request(contract_model, seed=SEED))
    assert raised.value.stage and raised.value.nan + raised.value.inf > 0, (
        f"NonFiniteAudio names stage {raised.value.stage!r} with {raised.value.nan} NaN and "
        f"{raised.value.inf} infinite values. Likely cause: raised by hand; call "
        f"check_finite(values, stage) between your stages")
    if Capability.STREAM in engine.capabilities:
        with pytest.raises(NonFiniteAudio):
            list(engine.stream(_plain_request(contract_model, seed=SEED)))


def test_hostile_requests_give_finite_audio_or_a_named_error(contract_model: ContractModel
                                                             ) -> None:
    """Arbitrary text (any Unicode, long words) and numbers: finite audio in [-1, 1] at the
    model's rate, or a MizuotoError."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from mizuoto_contract.strategies import HOSTILE_NUMBERS, TEXT, check_speaks, mostly

    fixture = contract_model.fixture
    engine = contract_model.engine

    @settings(max_examples=max(3, settings.default.max_examples // 8), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(text=TEXT, steps=mostly(st.just(fixture.steps), HOSTILE_NUMBERS),
           guidance=mostly(st.one_of(st.none(), st.floats(0, 10)), HOSTILE_NUMBERS),
           seed=st.one_of(st.none(), st.integers(0, MAX_SEED)))
    def speak(text, steps, guidance, seed):
        check_speaks(engine, lambda: engine.synthesize(_plain_request(
            contract_model, text=text, steps=steps, guidance=guidance, seed=seed)),
            full_scale=not getattr(fixture, "may_exceed_full_scale", False))

    speak()
