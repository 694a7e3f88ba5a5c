"""The core scheduler (``mizuoto.contracts.scheduler``): admission and back-pressure, rows
stepped together and joining between steps, cancellation and deadlines within one step, an
engine's step error, and the step interface behind ``Engine.stream``."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mizuoto import Audio, Rendered, errors
from mizuoto.contracts.scheduler import MAX_WAITING, Scheduler


class Counting:
    """Rows that count to their ``length`` (None: without end), one number per step."""

    name = "counting"
    max_rows = 4

    def __init__(self):
        self.steps: list[list[str]] = []
        self.closed: list[str] = []
        self.fail_at = None
        self.opened = threading.Event()

    def open_row(self, request, params, generator):
        if request == "refused":
            raise errors.InvalidRequest("text", "is refused")
        return {"name": request, "length": params, "done": 0}

    def step_rows(self, rows):
        self.steps.append([row["name"] for row in rows])
        if self.fail_at is not None and len(self.steps) >= self.fail_at:
            raise errors.NonFiniteAudio("counting", 1, 0, 1)
        out = []
        for row in rows:
            row["done"] += 1
            last = row["length"] is not None and row["done"] == row["length"]
            out.append((Rendered(Audio(torch.full((1,), float(row["done"])), 8000),
                                 last=last),))
        return out

    def close_row(self, row):
        self.closed.append(row["name"])


def _values(row):
    return [float(chunk.audio.samples[0]) for chunk in row]


def _wait(condition, limit=30.0):
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.005)


def test_rows_step_together_and_each_gets_its_own_chunks():
    engine = Counting()
    scheduler = Scheduler(engine, max_rows=4)
    gate = threading.Event()
    original = engine.step_rows

    def held(rows):  # the first step waits until every row is queued: they join together
        gate.wait(10)
        return original(rows)

    engine.step_rows = held
    rows = [scheduler.submit(name, length, None) for name, length in
            (("a", 3), ("b", 5), ("c", 1))]
    gate.set()
    assert [_values(row) for row in rows] == [[1, 2, 3], [1, 2, 3, 4, 5], [1]]
    assert max(len(step) for step in engine.steps) >= 2  # stepped together
    assert sorted(engine.closed) == ["a", "b", "c"] and scheduler.open_rows == 0
    assert scheduler.stats.rows == sum(len(step) for step in engine.steps)


def test_admission_is_bounded_and_waiting_rows_join_at_a_later_step():
    engine = Counting()
    scheduler = Scheduler(engine, max_rows=1, queue_size=1)
    first = scheduler.submit("a", None, None)
    second = scheduler.submit("b", 2, None)
    with pytest.raises(errors.EngineBusy, match="1 requests are being spoken and 1 wait"):
        scheduler.submit("c", 1, None)
    with pytest.raises(errors.InvalidRequest):  # refused in the caller's thread, at submit
        Scheduler(engine).submit("refused", 1, None)
    next(first)
    first.cancel()
    assert _values(second) == [1, 2]  # took the freed row
    assert "b" not in engine.steps[0]


def test_a_cancelled_row_stops_within_one_step_and_is_released():
    """Cancelled between steps, a row is released at once; cancelled (from another thread)
    during a step, as that step ends: no step after it."""
    engine = Counting()
    scheduler = Scheduler(engine)
    idle = scheduler.submit("idle", None, None)
    next(idle)
    idle.cancel()
    assert idle.ended and engine.closed == ["idle"] and list(idle) == []

    in_step, release = threading.Event(), threading.Event()
    original = engine.step_rows

    def slow(rows):
        in_step.set()
        release.wait(30)
        return original(rows)

    engine.step_rows = slow
    busy = scheduler.submit("busy", None, None)
    got = []
    consumer = threading.Thread(target=lambda: got.extend(_values(busy)))
    consumer.start()
    assert in_step.wait(30)
    busy.cancel()  # while its step runs
    assert not busy.ended
    steps = len(engine.steps) + 1  # the step being taken
    release.set()
    consumer.join(30)
    assert busy.ended and engine.closed == ["idle", "busy"]
    assert len(engine.steps) == steps and got == []  # the step's chunk dropped, no more steps
    assert scheduler.open_rows == 0


def test_a_deadline_ends_the_row_with_a_named_error():
    scheduler = Scheduler(Counting())
    late = scheduler.submit("late", None, None, deadline=time.monotonic() - 1)
    with pytest.raises(errors.DeadlineExceeded, match="deadline"):
        list(late)


def test_a_row_whose_client_reads_nothing_sits_the_steps_out():
    """Steps are taken by the consumers that want chunks: a row whose consumer reads none is
    stepped along until it holds MAX_WAITING chunks, then left out (back-pressure); once it
    reads, it joins the steps again."""
    engine = Counting()
    scheduler = Scheduler(engine)
    unread = scheduler.submit("unread", None, None)
    reader = scheduler.submit("reader", 3 * MAX_WAITING, None)
    assert len(_values(reader)) == 3 * MAX_WAITING
    assert unread.steps == MAX_WAITING
    assert [float(next(unread).audio.samples[0]) for _ in range(MAX_WAITING + 1)] == \
        list(range(1, MAX_WAITING + 2))
    assert unread.steps == MAX_WAITING + 1
    unread.cancel()
    assert unread.ended and engine.closed == ["reader", "unread"]


def test_a_failed_step_ends_its_rows_and_a_failed_progress_its_own():
    engine = Counting()
    scheduler = Scheduler(engine)
    engine.fail_at = 1
    row = scheduler.submit("a", 3, None)
    with pytest.raises(errors.NonFiniteAudio):
        list(row)
    engine.fail_at = None

    def gone(progress):
        raise RuntimeError("the client left")

    left = scheduler.submit("left", None, None, progress=gone)
    with pytest.raises(RuntimeError, match="client left"):
        list(left)
    assert engine.closed == ["a", "left"] and scheduler.open_rows == 0


def test_an_engine_declaring_the_step_interface_streams_through_its_scheduler(tmp_path):
    """The example plugin: batched rows equal each request alone (its own generator), and
    stream/synthesize run through the scheduler (its statistics count the rows)."""
    pytest.importorskip("mizuoto_example")
    import mizuoto
    from mizuoto.contracts.features import stepping_engine
    from mizuoto_example.engine import write_tiny_model

    write_tiny_model(tmp_path)
    toy = mizuoto.load(tmp_path, engine="toy")
    assert stepping_engine(toy) is toy and toy.max_batch == toy.max_rows
    requests = [mizuoto.SynthesisRequest(f"Row number {i} hums here.", seed=i)
                for i in range(3)]
    alone = [toy.synthesize(request).audio.samples for request in requests]
    streams = [toy.stream(request) for request in requests]
    together = [torch.cat([chunk.audio.samples for chunk in stream]) for stream in streams]
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))
    assert toy.batch_stats.rows > toy.batch_stats.steps  # some steps held several rows


def test_a_row_waiting_for_its_own_threads_rows_is_refused_at_once():
    """Every row held by streams this thread has not finished: a second request from it would
    wait for itself, so it is refused at once, naming the engine's rows setting; a request
    from another thread waits for a row instead and runs once one ends."""
    engine = Counting()
    engine.rows_setting = "engines.counting.rows"
    scheduler = Scheduler(engine, max_rows=1)
    first = scheduler.submit("a", None, None)
    next(first)
    second = scheduler.submit("b", 1, None)
    with pytest.raises(errors.EngineBusy, match="engines.counting.rows"):
        next(second)
    assert second.ended and "b" in engine.closed and scheduler.open_rows == 1

    got = []
    other = threading.Thread(target=lambda: got.extend(_values(scheduler.submit("c", 2, None))))
    other.start()
    _wait(lambda: scheduler.open_rows == 2)  # "c" waits for the row "a" holds
    first.cancel()
    other.join(30)
    assert got == [1, 2] and scheduler.open_rows == 0


def test_rows_held_for_a_change_of_weights():
    engine = Counting()
    scheduler = Scheduler(engine)
    row = scheduler.submit("a", None, None)
    with pytest.raises(errors.EngineBusy, match="open"), scheduler.hold_rows():
        pass
    row.cancel()
    with scheduler.hold_rows():
        with pytest.raises(errors.EngineBusy, match="changing"):
            scheduler.submit("b", 1, None)
    assert _values(scheduler.submit("b", 1, None)) == [1]
