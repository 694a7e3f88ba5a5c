"""A stream cancelled from another thread stops at its next chunk and gives the engine back;
closing the generator there would raise "generator already executing" (issue 33, 4)."""

from __future__ import annotations

import threading

from mizuoto.contracts.request_lock import NoLock, RequestLock


def _chunks(made: list, finished: list, gate: threading.Event | None = None,
            entered: threading.Event | None = None):
    try:
        for index in range(100):
            if gate is not None and index == 1:
                entered.set()
                gate.wait()
            made.append(index)
            yield index
    finally:
        finished.append(True)


def test_cancel_from_another_thread_while_paused_ends_it_and_frees_the_lock():
    lock, made, finished = RequestLock("test"), [], []
    stream = lock.stream(_chunks(made, finished))
    assert next(stream) == 0
    canceller = threading.Thread(target=stream.cancel)
    canceller.start()
    canceller.join()
    assert finished == [True] and stream.cancelled and list(stream) == []
    assert not lock._lock.locked()
    with lock:  # the engine serves the next request
        pass


def test_cancel_while_a_chunk_is_being_made_stops_at_that_chunk():
    lock, made, finished = RequestLock("test"), [], []
    gate, entered, errors = threading.Event(), threading.Event(), []
    stream = lock.stream(_chunks(made, finished, gate, entered))
    assert next(stream) == 0
    received = []
    consumer = threading.Thread(target=lambda: received.extend(stream))
    consumer.start()
    entered.wait()  # the consumer is inside the generator, making chunk 1

    def cancel():
        try:
            stream.cancel()  # the generator is executing: no "already executing" error
        except Exception as exc:  # pragma: no cover - the failure this test is for
            errors.append(exc)
        gate.set()

    threading.Thread(target=cancel).start()
    consumer.join()
    assert errors == [] and received == [] and made == [0, 1] and finished == [True]
    assert not lock._lock.locked()


def test_a_stream_without_a_lock_cancels_too():
    made, finished = [], []
    stream = NoLock().stream(_chunks(made, finished))
    assert next(stream) == 0
    stream.cancel()
    stream.cancel()  # twice is fine
    assert list(stream) == [] and finished == [True]
