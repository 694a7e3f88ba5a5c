"""The engine base class: unimplemented compute options refused, requests serialized."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import FakeEngine

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
