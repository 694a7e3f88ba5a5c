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
from mizuoto.contracts.requests import MAX_SEED
from mizuoto.errors import (
    InvalidAudio,
    InvalidOption,
    InvalidRequest,
    MizuotoError,
    NonFiniteAudio,
    UnsupportedCapability,
    VoiceMismatch,
)
from mizuoto.options import ComputeOptions, Options
from mizuoto.registry import get_engine
from mizuoto.runtime.allocator import loaded_allocator
from mizuoto_contract.models import CONTRACT_OPTIONS, ContractModel
from mizuoto_contract.reference import REFERENCE_TEXT, write_silence

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
    _check_applied(model, result.applied, seed=seed)


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
    assert type(engine) is get_engine(fixture.engine)
    assert info.engine == engine.name == fixture.engine
    assert info.model == f"contract/{fixture.id}", "ModelInfo.model must be the model_id given"
    assert isinstance(info.variant, str)
    assert isinstance(info.sample_rate, int) and info.sample_rate > 0
    assert info.dtype in DTYPES
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
                        "cuda_graphs": True,
                        "device": "cpu", "dtype": "float32"}


def test_unimplemented_compute_options_are_refused(contract_model: ContractModel) -> None:
    """An option the engine does not implement is never silently ignored: set to a non-default
    value it is refused at load, naming the option and the engine."""
    engine_cls = type(contract_model.engine)
    assert set(_NON_DEFAULT_COMPUTE) == {f.name for f in attrs.fields(ComputeOptions)}
    for name, value in _NON_DEFAULT_COMPUTE.items():
        if name in engine_cls.compute_options:
            continue
        options = Options.from_mapping({"compute": {"device": "cpu", name: value}})
        with pytest.raises(InvalidOption) as caught:
            mizuoto.load(contract_model.directory, engine=engine_cls.name, options=options)
        assert caught.value.key == f"compute.{name}" and engine_cls.name in str(caught.value)
        with pytest.raises(InvalidOption):
            engine_cls.load(contract_model.directory, options=options)


def test_seeded_synthesis_is_deterministic(contract_model: ContractModel) -> None:
    request = _plain_request(contract_model, seed=SEED)
    first = contract_model.engine.synthesize(request)
    second = contract_model.engine.synthesize(request)
    _check_result(contract_model, first, seed=SEED)
    _check_result(contract_model, second, seed=SEED)
    assert torch.equal(first.audio.samples, second.audio.samples)


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
        assert torch.equal(together[index], expected), f"request {index} differs when concurrent"


def test_unseeded_synthesis_reports_its_seed(contract_model: ContractModel) -> None:
    drawn = contract_model.engine.synthesize(_plain_request(contract_model))
    _check_result(contract_model, drawn)
    assert drawn.applied.seed_drawn is True, (
        "an unseeded request must report seed_drawn=True and the seed it drew: draw it with "
        "mizuoto.runtime.seeds.resolve_seed(request.seed)")
    replay = contract_model.engine.synthesize(_plain_request(contract_model,
                                                             seed=drawn.applied.seed))
    _check_result(contract_model, replay, seed=drawn.applied.seed)
    assert torch.equal(drawn.audio.samples, replay.audio.samples)


def test_unknown_param_is_named(contract_model: ContractModel) -> None:
    params = {**contract_model.fixture.request_params, "no_such_setting": 1}
    with pytest.raises(InvalidRequest) as raised:
        contract_model.engine.synthesize(_plain_request(contract_model, params=params))
    assert "no_such_setting" in raised.value.field


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


# -- references (cloning) ---------------------------------------------------------------------

@requires(Capability.CLONE)
def test_clone(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model), seed=SEED)
    result = contract_model.engine.synthesize(request)
    _check_result(contract_model, result, seed=SEED)
    assert torch.equal(result.audio.samples,
                       contract_model.engine.synthesize(request).audio.samples)


@requires(Capability.CLONE, when=lambda fixture: fixture.needs_reference_text)
def test_clone_without_reference_text_is_refused(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model, text=None), seed=SEED)
    with pytest.raises(InvalidRequest) as raised:
        contract_model.engine.synthesize(request)
    assert raised.value.field.startswith("reference")


@requires(Capability.CLONE, when=lambda fixture: not fixture.needs_reference_text)
def test_clone_without_reference_text(contract_model: ContractModel) -> None:
    request = _request(contract_model, reference=_reference(contract_model, text=None), seed=SEED)
    _check_result(contract_model, contract_model.engine.synthesize(request), seed=SEED)


@requires(Capability.CLONE)
def test_missing_reference_file_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    reference = Reference(tmp_path / "no-such-recording.wav", text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference")


@requires(Capability.CLONE)
def test_unreadable_reference_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    path = tmp_path / "not-audio.wav"
    path.write_bytes(b"RIFF, but not really a WAV file" * 8)
    reference = Reference(path, text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference")


@requires(Capability.CLONE)
def test_silent_reference_is_invalid_audio(contract_model: ContractModel, tmp_path) -> None:
    path = write_silence(tmp_path / "silence.wav", contract_model.engine.info.sample_rate)
    reference = Reference(path, text=REFERENCE_TEXT)
    with pytest.raises(InvalidAudio) as raised:
        contract_model.engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    assert raised.value.field.startswith("reference")


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
    assert torch.equal(result.audio.samples,
                       contract_model.engine.synthesize(request).audio.samples)
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
    assert torch.equal(result.audio.samples, contract_model.engine.edit(request).audio.samples)


@requires(Capability.LONG_TEXT)
def test_long_text(contract_model: ContractModel) -> None:
    request = _plain_request(contract_model, text=LONG_TEXT, seed=SEED)
    result = contract_model.engine.synthesize(request)
    _check_result(contract_model, result, seed=SEED)
    assert result.applied.chunks >= 1
    assert torch.equal(result.audio.samples,
                       contract_model.engine.synthesize(request).audio.samples)


def _stream(model: ContractModel, request: SynthesisRequest) -> list[AudioChunk]:
    chunks = list(model.engine.stream(request))
    assert chunks, "a stream yields at least one chunk"
    for position, chunk in enumerate(chunks):
        assert isinstance(chunk, AudioChunk)
        assert chunk.index == position
        assert chunk.is_last == (position == len(chunks) - 1)
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
    assert torch.equal(joined, contract_model.engine.synthesize(request).audio.samples)


def _joined(chunks) -> torch.Tensor:
    return torch.cat([chunk.audio.samples for chunk in chunks])


@requires(Capability.STREAM)
def test_a_stream_is_not_changed_by_requests_between_its_chunks(
        contract_model: ContractModel) -> None:
    """``it = stream(A); next(it); synthesize(B); stream(C); rest``, all in one thread: A's
    chunks equal A streamed alone, and B and C equal their own runs alone."""
    engine = contract_model.engine
    first = _plain_request(contract_model, seed=SEED)
    second = _plain_request(contract_model, seed=SEED + 1, text=EDITED_TEXT)
    alone = _joined(_stream(contract_model, first))
    other_alone = engine.synthesize(second).audio.samples
    other_streamed = _joined(_stream(contract_model, second))
    stream = iter(engine.stream(first))
    head = [next(stream)]
    between = engine.synthesize(second).audio.samples
    nested = _joined(engine.stream(second))
    rest = list(stream)
    assert torch.equal(between, other_alone), "a request made inside a stream differs"
    assert torch.equal(nested, other_streamed), "a stream opened inside a stream differs"
    assert torch.equal(_joined(head + rest), alone), (
        "a stream's audio changed when other requests ran between its chunks")


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
        assert torch.equal(together[index], expected), f"stream {index} differs when concurrent"


@requires(Capability.STREAM)
def test_unseeded_stream_reports_its_seed(contract_model: ContractModel) -> None:
    chunks = _stream(contract_model, _plain_request(contract_model))
    applied = chunks[-1].applied
    _check_applied(contract_model, applied, seed=None)
    assert applied.seed_drawn is True
    replay = _stream(contract_model, _plain_request(contract_model, seed=applied.seed))
    assert torch.equal(torch.cat([c.audio.samples for c in chunks]),
                       torch.cat([c.audio.samples for c in replay]))


@requires(Capability.VOICE_CACHE)
def test_saved_voice_speaks_like_its_reference(contract_model: ContractModel, tmp_path) -> None:
    engine, info = contract_model.engine, contract_model.engine.info
    reference = _reference(contract_model)
    voice = engine.build_voice(reference)
    assert (voice.engine, voice.model_fingerprint) == (info.engine, info.fingerprint)
    path = voice.save(tmp_path / "voice.safetensors")
    loaded = Voice.load(path)
    assert (loaded.engine, loaded.model_fingerprint) == (voice.engine, voice.model_fingerprint)
    assert set(loaded.tensors) == set(voice.tensors)
    assert all(torch.equal(loaded.tensors[k], voice.tensors[k]) for k in voice.tensors)
    by_voice = engine.synthesize(_request(contract_model, voice=loaded, seed=SEED))
    by_reference = engine.synthesize(_request(contract_model, reference=reference, seed=SEED))
    _check_result(contract_model, by_voice, seed=SEED)
    assert torch.equal(by_voice.audio.samples, by_reference.audio.samples)


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
    assert raised.value.stage and raised.value.nan + raised.value.inf > 0
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
