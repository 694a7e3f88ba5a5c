"""Every engine's one scheduling object (``mizuoto.contracts.scheduling``): requests taking
turns per chunk alternate, the serial policy refuses the same-thread conflict, cancellation
stops at the next chunk, and each reports its capacity, what is active and waiting, and
whether the engine is idle."""

from __future__ import annotations

import threading
import time

import pytest
from stub_engines import StubEngine

from mizuoto import Audio, Rendered, SynthesisRequest
from mizuoto.contracts.api import PluginAPIDeprecation
from mizuoto.contracts.features import SupportsSteps
from mizuoto.contracts.request_lock import NoLock, RequestLock
from mizuoto.contracts.scheduler import Scheduler
from mizuoto.contracts.turns import ChunkTurns
from mizuoto.errors import RequestConflict

CHUNKS = 3
WAIT = 30.0


def _wait(condition, limit=WAIT):
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.002)


class Reading(StubEngine):
    """Speaks ``CHUNKS`` chunks per request, recording which request made each; a chunk may
    wait (``pace``) for something the test wants to happen while it holds its turn."""

    name = "reading"

    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []
        self.pace = lambda text: None

    def _stream(self, request, params, generator, progress):
        for index in range(CHUNKS):
            self.made.append(request.text)
            self.pace(request.text)
            yield Rendered(Audio([0.1] * 80, 8000), last=index == CHUNKS - 1)


class TakingTurns(Reading):
    takes_turns_per = "chunk"


def _request(text):
    return SynthesisRequest(text, seed=1)


def test_each_engine_has_one_scheduling_object_of_the_kind_it_declares():
    serial, turns = Reading(), TakingTurns()
    assert serial.scheduling is serial.scheduling
    assert isinstance(serial.scheduling, RequestLock) and serial.scheduling.capacity == 1
    assert isinstance(turns.scheduling, ChunkTurns) and turns.scheduling.capacity is None
    with pytest.warns(PluginAPIDeprecation):
        legacy = type("Legacy", (Reading,), {"concurrent_requests": True})()
    assert isinstance(legacy.scheduling, NoLock) and legacy.scheduling.capacity is None
    assert Reading().scheduling is not serial.scheduling  # per loaded engine


def test_declaring_concurrent_requests_still_works_with_a_deprecation():
    with pytest.warns(PluginAPIDeprecation, match="takes_turns_per = 'chunk'.*SupportsSteps"):
        legacy = type("Legacy", (Reading,), {"concurrent_requests": True})
    engine = legacy()
    stream = engine.stream(_request("a"))
    next(stream)
    assert engine.synthesize(_request("b"))  # runs during the open stream: no lock
    assert list(stream) and engine.made == ["a", "b", "b", "b", "a", "a"]


def test_an_unknown_turn_declaration_is_refused_naming_the_choices():
    with pytest.raises(TypeError, match="takes_turns_per.*request, chunk"):
        type("Odd", (Reading,), {"takes_turns_per": "word"})


def test_requests_taking_turns_per_chunk_alternate_on_two_threads():
    engine = TakingTurns()
    scheduling = engine.scheduling
    # each chunk is made only once the other request waits for its turn (or has ended), so
    # a turn that were not handed to the waiter would show as two chunks of one request
    engine.pace = lambda text: _wait(lambda: scheduling.waiting >= 1
                                     or engine.made.count("b" if text == "a" else "a")
                                     == CHUNKS)
    streams = {name: engine.stream(_request(name)) for name in "ab"}
    assert scheduling.active == 2 and not scheduling.idle  # open, none started
    threads = [threading.Thread(target=list, args=(streams[name],)) for name in "ab"]
    threads[0].start()
    _wait(lambda: engine.made)  # "a" holds the first turn
    threads[1].start()
    for thread in threads:
        thread.join(WAIT)
    assert engine.made == ["a", "b"] * CHUNKS
    assert scheduling.idle and scheduling.active == 0 and scheduling.waiting == 0


def test_synthesize_of_an_engine_taking_turns_joins_its_chunks():
    engine = TakingTurns()
    result = engine.synthesize(_request("a"))
    assert result.audio.samples.shape[-1] == 80 * CHUNKS and engine.made == ["a"] * CHUNKS
    assert engine.scheduling.idle


def test_a_nested_request_in_a_turn_re_enters():
    engine = TakingTurns()
    nested = []

    def pace(text):
        if text == "a" and not nested:
            nested.append(engine.synthesize(_request("b")))  # inside a's turn, same thread

    engine.pace = pace
    list(engine.stream(_request("a")))
    assert engine.made == ["a", "b", "b", "b", "a", "a"] and engine.scheduling.idle


@pytest.mark.parametrize("engine_class", [Reading, TakingTurns], ids=["serial", "chunk"])
def test_a_cancelled_stream_stops_at_its_next_chunk_and_the_engine_is_idle(engine_class):
    engine = engine_class()
    stream = engine.stream(_request("a"))
    next(stream)
    assert engine.scheduling.active == 1 and not engine.scheduling.idle
    canceller = threading.Thread(target=stream.cancel)
    canceller.start()
    canceller.join(WAIT)
    assert list(stream) == [] and engine.made == ["a"]
    assert engine.scheduling.idle and engine.scheduling.wait_idle(0)
    unstarted = engine.stream(_request("b"))
    unstarted.close()  # closed before its first chunk
    assert engine.scheduling.idle and engine.made == ["a"]


@pytest.mark.parametrize("engine_class", [Reading, TakingTurns], ids=["serial", "chunk"])
def test_a_failing_stream_leaves_the_engine_idle(engine_class):
    engine = engine_class()

    def fail(text):
        raise RuntimeError("the model broke")

    engine.pace = fail
    with pytest.raises(RuntimeError, match="broke"):
        engine.synthesize(_request("a"))
    assert engine.scheduling.idle


def test_the_serial_policy_refuses_a_second_request_from_the_streams_thread():
    engine = Reading()
    stream = engine.stream(_request("a"))
    next(stream)
    with pytest.raises(RequestConflict, match="Finish or close the stream first"):
        engine.synthesize(_request("b"))
    assert list(stream) and engine.made == ["a"] * CHUNKS and engine.scheduling.idle


def test_the_serial_policy_counts_a_request_waiting_on_another_thread():
    engine = Reading()
    scheduling = engine.scheduling
    stream = engine.stream(_request("a"))
    next(stream)
    waiter = threading.Thread(target=engine.synthesize, args=(_request("b"),))
    waiter.start()
    _wait(lambda: scheduling.waiting == 1)
    assert scheduling.active == 1 and not scheduling.wait_idle(0.01)
    list(stream)
    waiter.join(WAIT)
    assert engine.made == ["a"] * CHUNKS + ["b"] * CHUNKS
    assert scheduling.idle and (scheduling.active, scheduling.waiting) == (0, 0)


class SteppingRows(SupportsSteps, Reading):
    """A stepping engine: each row is one request, spoken in one chunk at its first step."""

    name = "rows"

    def open_row(self, request, params, generator):
        return request

    def step_rows(self, rows):
        return [(Rendered(Audio([0.1] * 8, 8000), last=True),) for _ in rows]

    def close_row(self, row):
        return None


def test_the_step_scheduler_reports_rows_as_active_and_waiting():
    scheduler = Scheduler(SteppingRows(), max_rows=1)
    assert scheduler.capacity == 1 and scheduler.idle
    first, second = scheduler.submit("a", None, None), scheduler.submit("b", None, None)
    assert (scheduler.active, scheduler.waiting) == (0, 2) and not scheduler.idle
    assert len(list(first)) == 1 and scheduler.waiting == 1
    second.cancel()
    assert scheduler.idle and scheduler.wait_idle(0)


def _rows_engine():
    engine = SteppingRows()
    assert isinstance(engine.scheduling, Scheduler)
    return engine


def _legacy_engine():
    with pytest.warns(PluginAPIDeprecation):
        return type("Legacy", (Reading,), {"concurrent_requests": True})()


@pytest.mark.parametrize("make", [Reading, TakingTurns, _legacy_engine, _rows_engine],
                         ids=["serial", "chunk", "no-lock", "scheduler"])
def test_a_request_handed_on_counts_until_released_before_it_reaches_the_engine(make):
    """A server reserves a request when it hands it on (a lane's thread): the engine is not
    idle until the reservation is released, also while the request runs."""
    engine = make()
    scheduling = engine.scheduling
    reservation = scheduling.reserve()
    assert scheduling.reserved == 1 and not scheduling.idle and not scheduling.wait_idle(0)
    assert (scheduling.active, scheduling.waiting) == (0, 0)  # not in the engine yet
    released = threading.Event()
    waiter = threading.Thread(target=lambda: scheduling.wait_idle(WAIT) and released.set())
    waiter.start()
    engine.synthesize(_request("a"))  # run and ended: still held by the reservation
    assert not scheduling.idle and not released.is_set()
    reservation.release()
    waiter.join(WAIT)
    assert released.is_set() and scheduling.idle and scheduling.reserved == 0
    reservation.release()  # once only
    assert scheduling.reserved == 0


@pytest.mark.parametrize("engine_class", [Reading, TakingTurns], ids=["serial", "chunk"])
def test_a_stream_cancelled_while_making_a_chunk_is_active_until_that_chunk_is_done(
        engine_class):
    engine = engine_class()
    entered, release = threading.Event(), threading.Event()

    def pace(text):
        if len(engine.made) == 2:
            entered.set()
            release.wait(WAIT)

    engine.pace = pace
    stream = engine.stream(_request("a"))
    next(stream)
    received = []
    consumer = threading.Thread(target=lambda: received.extend(stream))
    consumer.start()
    assert entered.wait(WAIT)
    stream.cancel()
    assert not engine.scheduling.idle  # its chunk is still being made
    release.set()
    consumer.join(WAIT)
    assert received == [] and engine.made == ["a", "a"] and engine.scheduling.idle
