"""The engine base class: unimplemented compute options refused, requests serialized."""

from __future__ import annotations

import threading
import time

import attrs
import pytest
from conftest import FakeEngine
from stub_engines import StubEngine

from mizuoto import Options
from mizuoto.contracts.engine import engine_lock
from mizuoto.errors import InvalidOption


def test_unimplemented_compute_option_is_refused_naming_option_and_engine():
    FakeEngine.check_compute(Options())  # defaults are always fine
    FakeEngine.check_compute(Options.from_mapping({"compute.cpu_threads": 2}))  # implemented
    with pytest.raises(InvalidOption) as caught:
        FakeEngine.check_compute(Options.from_mapping({"compute.compile": True}))
    assert caught.value.key == "compute.compile"
    assert "fake engine does not implement it" in str(caught.value)
    assert "compute.cpu_threads" in str(caught.value)  # what it does implement


def test_prepack_off_is_a_no_op_every_engine_accepts():
    """One settings file for all engines: compute.prepack=off is what an engine that packs no
    weights already runs, so it is accepted (auto, the default, too) and reported."""
    assert "prepack" not in FakeEngine.compute_options
    FakeEngine.check_compute(Options.from_mapping({"compute.prepack": "off"}))
    assert FakeEngine("m", None).compute_in_effect()["prepack"] == {"mode": "off"}


class _Racy(FakeEngine):
    """Per-request state on the instance: without the lock, a second thread overwrites it."""

    name = "racy"

    def synthesize(self, request, *, progress=None):
        self.current = request.text
        time.sleep(0.05)
        return self.current

    def stream(self, request, *, progress=None):
        self.current = request.text
        for _ in range(3):
            time.sleep(0.01)
            yield self.current


def _engine() -> _Racy:
    return _Racy("m", None)


class _Request:
    def __init__(self, text):
        self.text = text


def test_synthesize_calls_from_threads_are_serialized():
    engine = _engine()
    results = {}

    def run(text):
        results[text] = engine.synthesize(_Request(text))

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {f"t{i}": f"t{i}" for i in range(6)}


def test_a_stream_holds_the_lock_until_it_ends_even_when_resumed_on_another_thread():
    engine = _engine()
    chunks = engine.stream(_Request("a"))
    first = next(chunks)
    other: list = []
    blocked = threading.Thread(target=lambda: other.append(engine.synthesize(_Request("b"))))
    blocked.start()
    time.sleep(0.1)
    assert other == []  # the stream still owns the engine
    # a server may resume the generator on another worker thread
    rest: list = []
    worker = threading.Thread(target=lambda: rest.extend(chunks))
    worker.start()
    worker.join()
    blocked.join(timeout=5)
    assert [first, *rest] == ["a", "a", "a"] and other == ["b"]


def test_the_lock_is_reentrant_for_its_holder():
    engine = _engine()
    with engine_lock(engine):
        assert engine.synthesize(_Request("x")) == "x"


def test_base_class_defaults_raise_unsupported_capability():
    import attrs

    from mizuoto import Capability
    from mizuoto.errors import UnsupportedCapability

    engine = FakeEngine("m", None)
    with pytest.raises(UnsupportedCapability, match="does not support stream"):
        engine.stream(None)
    # declared but not implemented: still a named error, which says it is the plugin's bug
    engine._info = attrs.evolve(engine._info, capabilities=engine._info.capabilities
                                | {Capability.EDIT, Capability.VOICE_CACHE})
    with pytest.raises(UnsupportedCapability, match="does not implement edit"):
        engine.edit(None)
    with pytest.raises(UnsupportedCapability, match="bug in the fake plugin"):
        engine.build_voice(None)


def test_a_bad_param_value_names_the_param():
    import attrs

    from mizuoto.contracts.engine import parse_attrs
    from mizuoto.errors import InvalidRequest

    @attrs.frozen
    class Params:
        speed: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
        steps: int = attrs.field(default=4, validator=attrs.validators.instance_of(int))

    with pytest.raises(InvalidRequest) as caught:
        parse_attrs(Params, {"speed": -1.0, "steps": 2}, "params")
    assert caught.value.field == "params.speed"
    with pytest.raises(InvalidRequest) as caught:
        parse_attrs(Params, {"steps": "many"}, "params")
    assert caught.value.field == "params.steps"


# -- issue 22 item 6: a request never walks into a stream's state ------------------------------

class _Humming(StubEngine):
    """API 1.1: the base class does the shared work; per-request state in the instance."""

    name = "humming"

    def _synthesize(self, request, params, generator, progress):
        from mizuoto import Audio, Rendered

        self.current = request.text
        return Rendered(Audio([0.1] * 80, 8000), extra={"text": self.current})

    def _stream(self, request, params, generator, progress):
        from mizuoto import Audio, Rendered

        self.current = request.text
        for index in range(3):
            yield Rendered(Audio([0.1] * 80, 8000), extra={"text": self.current},
                           last=index == 2)


def _humming(**declared):
    return type("Declared", (_Humming,), declared)()


def _text_request(text):
    from mizuoto import SynthesisRequest

    return SynthesisRequest(text, seed=1)


@pytest.mark.parametrize("make", [_humming, _engine], ids=["api-1.1", "api-1.0"])
def test_a_second_request_from_the_thread_of_an_open_stream_is_refused(make):
    from mizuoto.errors import RequestConflict

    engine = make()
    request = _text_request("a") if make is _humming else _Request("a")
    chunks = iter(engine.stream(request))
    first = next(chunks)
    with pytest.raises(RequestConflict, match="Finish or close the stream first"):
        engine.synthesize(_text_request("b") if make is _humming else _Request("b"))
    rest = list(chunks)
    assert len([first, *rest]) == 3
    # once the stream has ended the engine takes requests again
    assert engine.synthesize(_text_request("c") if make is _humming else _Request("c"))


def test_a_closed_stream_releases_the_engine():
    engine = _humming()
    chunks = iter(engine.stream(_text_request("a")))
    next(chunks)
    chunks.close()
    assert engine.synthesize(_text_request("b")).applied.extra["text"] == "b"


def test_an_engine_that_opts_in_runs_requests_concurrently_without_the_lock():
    from mizuoto.contracts.api import PluginAPIDeprecation

    with pytest.warns(PluginAPIDeprecation, match="concurrent_requests"):  # API 1.1's opt-in
        engine = _humming(concurrent_requests=True)
    chunks = iter(engine.stream(_text_request("a")))
    next(chunks)
    assert engine.synthesize(_text_request("b")).applied.extra["text"] == "b"
    # no lock: its scheduling object only counts the open stream, bounding nothing
    assert engine.scheduling.capacity is None and engine.scheduling.active == 1
    list(chunks)
    assert engine.scheduling.idle


def test_the_base_class_builds_applied_and_refuses_what_the_engine_lacks():
    from mizuoto import Capability, SynthesisRequest
    from mizuoto.errors import InvalidRequest, UnsupportedCapability
    from mizuoto.runtime.in_effect import compute_in_effect

    engine = _humming(request_settings=frozenset({"steps"}))
    result = engine.synthesize(SynthesisRequest("hi\x07", steps=4))
    applied = result.applied
    assert (applied.engine, applied.model, applied.seed_drawn) == ("humming", "m", True)
    assert applied.compute == compute_in_effect(prepack={"mode": "off"})  # packs nothing
    assert any("control" in w for w in applied.warnings)  # the request's notice
    with pytest.raises(InvalidRequest) as caught:
        engine.synthesize(SynthesisRequest("hi", guidance=2.0))
    assert caught.value.field == "guidance"
    with pytest.raises(UnsupportedCapability):
        engine.synthesize(SynthesisRequest("hi", instruction="calm"))
    assert Capability.EDIT not in engine.capabilities
    assert _Humming.plugin_api == "1.1" and _Racy.plugin_api == "1.0"


def test_an_api_1_0_result_gets_compute_filled_in():
    from mizuoto import SynthesisRequest
    from mizuoto.runtime.in_effect import compute_in_effect

    result = FakeEngine("m", None).synthesize(SynthesisRequest("hi"))
    assert result.applied.compute == compute_in_effect(prepack={"mode": "off"})


@pytest.mark.parametrize(("value", "error"), [(float("inf"), "OverflowError"),
                                              (float("nan"), "ValueError"),
                                              ("many", "ValueError"), ([1], "TypeError")])
def test_a_converter_that_refuses_a_value_names_the_param(value, error):
    """``converter=int`` (as the attrs style invites): inf raises OverflowError inside the
    converter, "many" ValueError, a list TypeError; each is an InvalidRequest naming it."""
    import attrs

    from mizuoto.contracts.engine import parse_attrs
    from mizuoto.errors import InvalidRequest

    @attrs.frozen
    class Params:
        speed: float = 1.0
        steps: int = attrs.field(default=4, converter=int)

    with pytest.raises(InvalidRequest) as caught:
        parse_attrs(Params, {"speed": 2.0, "steps": value}, "params")
    assert caught.value.field == "params.steps"
    assert type(caught.value.__cause__).__name__ == error


@pytest.mark.parametrize("second", ["stream", "synthesize", "build_voice"])
def test_every_call_from_the_thread_of_an_open_stream_is_refused(second):
    """The class, not the one example: a second stream, a voice, a synthesis."""
    from mizuoto import Capability, Reference
    from mizuoto.errors import RequestConflict

    class Voiced(_Humming):
        def _build_voice(self, reference):
            self.current = "voice"
            return None

    engine = Voiced()
    engine._info = attrs.evolve(engine._info, capabilities=engine._info.capabilities
                                | {Capability.VOICE_CACHE})
    chunks = iter(engine.stream(_text_request("a")))
    next(chunks)
    with pytest.raises(RequestConflict):
        if second == "stream":
            next(iter(engine.stream(_text_request("b"))))
        elif second == "synthesize":
            engine.synthesize(_text_request("b"))
        else:
            engine.build_voice(Reference("ref.wav"))
    assert [c.applied.extra["text"] for c in chunks if c.is_last] == ["a"]
