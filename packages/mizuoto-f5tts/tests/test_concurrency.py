"""F5-TTS requests at once on one engine (tiny random model): each result equals the same
request alone, long texts take turns chunk by chunk under the compute lock, and a progress
callback may call the engine again."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mizuoto import EditRequest, Reference, SynthesisRequest
from mizuoto.plugin import Turns

# A two-second reference with a one-word transcript: its speaking rate gives chunks of about
# 40 bytes, so each sentence below is a chunk of its own. fix_duration keeps every chunk a
# few hundred frames, whatever its share of the 22-second chunk budget.
FIRST = " ".join(f"Alpha sentence {i} is here." for i in range(4))
SECOND = " ".join(f"Bravo line {i} comes next." for i in range(3))
PARAMS = {"fix_duration": 4.0}
WAIT = 60  # seconds before a thread that should have finished counts as stuck


@pytest.fixture(scope="module")
def terse(ref):
    return Reference(ref.audio, text="Hi.")


@pytest.fixture(scope="module")
def requests(terse):
    return {"A": SynthesisRequest(FIRST, reference=terse, seed=3, steps=2, params=PARAMS),
            "B": SynthesisRequest(SECOND, reference=terse, seed=4, steps=2, params=PARAMS)}


@pytest.fixture(scope="module")
def alone(engine, requests):
    results = {name: engine.synthesize(request) for name, request in requests.items()}
    assert results["A"].applied.chunks == 4 and results["B"].applied.chunks == 3
    return {name: result.audio.samples for name, result in results.items()}


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads), "a request did not finish"


def test_long_texts_in_two_threads_equal_each_alone(engine, requests, alone):
    results: dict[str, torch.Tensor] = {}
    start = threading.Barrier(2)

    def speak(name):
        start.wait()
        results[name] = engine.synthesize(requests[name]).audio.samples

    _run([threading.Thread(target=speak, args=(name,)) for name in requests])
    for name, expected in alone.items():
        assert torch.equal(results[name], expected), name


def test_long_texts_take_turns_chunk_by_chunk(engine, requests, alone):
    """B starts while A samples its first chunk, and is waiting for the compute lock before A
    releases it: B's chunks are sampled before A's last one (with one lock per request, B
    would wait for all of A's text)."""
    events: list[tuple[str, str, int]] = []  # (request, stage, done), in the order reported
    results: dict[str, torch.Tensor] = {}

    def speak(name, progress):
        results[name] = engine.synthesize(requests[name], progress=progress).audio.samples

    def record_b(report):
        events.append(("B", report.stage, report.done))

    second = threading.Thread(target=speak, args=("B", record_b))
    started = threading.Event()

    def record_a(report):
        events.append(("A", report.stage, report.done))
        if report.stage == "sampling" and not started.is_set():
            started.set()
            second.start()  # A holds the compute lock here, in its first chunk
            deadline = time.monotonic() + WAIT
            while engine.scheduling.waiting == 0:
                assert time.monotonic() < deadline, "B never asked for a turn"
                time.sleep(0.001)

    _run([threading.Thread(target=speak, args=("A", record_a))])
    second.join(WAIT)
    assert not second.is_alive()

    for name, expected in alone.items():
        assert torch.equal(results[name], expected), name
    # sampling is reported only under the compute lock: B sampled before A's last chunk did
    sampled = [who for who, stage, _ in events if stage == "sampling"]
    assert sampled[0] == "A"
    assert sampled.index("B") < len(sampled) - 1 - sampled[::-1].index("A"), sampled
    assert events.index(("B", "chunk", 0)) < events.index(("A", "chunk", 4))


def test_a_progress_callback_may_call_the_engine(engine, requests, alone):
    """A synthesize from inside another's progress callback, on the same thread, while that
    one holds the compute lock mid-sampling: no deadlock, both equal alone."""
    results: dict[str, torch.Tensor] = {}

    def nest(report):
        if report.stage == "chunk" and report.done == 1:
            nest.in_second_chunk = True
        elif report.stage == "sampling" and nest.in_second_chunk and "B" not in results:
            results["B"] = engine.synthesize(requests["B"]).audio.samples

    nest.in_second_chunk = False

    def speak():
        results["A"] = engine.synthesize(requests["A"], progress=nest).audio.samples

    _run([threading.Thread(target=speak)])
    for name, expected in alone.items():
        assert torch.equal(results[name], expected), name


def test_an_edit_and_a_voice_during_a_long_text_equal_each_alone(engine, requests, alone,
                                                                    ref):
    edit = EditRequest(ref, "A long reference line.", [(0.3, 0.6)], seed=2, steps=2)
    edited_alone = engine.edit(edit).audio.samples
    voice_alone = engine.build_voice(ref)
    results = {}
    start = threading.Barrier(3)

    def run(name, call):
        start.wait()
        results[name] = call()

    _run([threading.Thread(target=run, args=(name, call)) for name, call in (
        ("A", lambda: engine.synthesize(requests["A"]).audio.samples),
        ("edit", lambda: engine.edit(edit).audio.samples),
        ("voice", lambda: engine.build_voice(ref)))])
    assert torch.equal(results["A"], alone["A"])
    assert torch.equal(results["edit"], edited_alone)
    assert torch.equal(results["voice"].tensors["waveform"], voice_alone.tensors["waveform"])
    assert results["voice"].texts == voice_alone.texts


def test_the_compute_lock_goes_to_waiters_in_arrival_order():
    lock, order = Turns(), []

    def take(name):
        with lock:
            order.append(name)

    with lock:
        with lock:  # re-entrant for its holder
            pass
        waiters = []
        for name in ("first", "second"):
            waiters.append(threading.Thread(target=take, args=(name,)))
            waiters[-1].start()
            deadline = time.monotonic() + WAIT
            while lock.waiting < len(waiters):  # queued one after the other
                assert time.monotonic() < deadline
                time.sleep(0.001)
    take("holder again")  # queues behind both, though it was released on this thread
    for waiter in waiters:
        waiter.join(WAIT)
    assert order == ["first", "second", "holder again"]
    with pytest.raises(RuntimeError):
        lock.__exit__(None, None, None)  # not held by this thread
