"""``mizuoto serve --ray``'s Ctrl-C handling while it starts, without starting Ray: a Ctrl-C
whose KeyboardInterrupt Ray loses inside its start (it defers SIGINT in its task submission)
still stops the command once the start returns, instead of serving until a second signal; a
start that never returns after one ends the command ``STOP_LIMIT`` seconds later; once
serving, the interrupt watch is gone (a graceful stop is not cut short).

Ray is core's ``ray`` extra, installed in CI's ``ci`` session, where these tests run; the
importorskip lets core's suite run where that extra is not installed (``run`` imports ray)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from mizuoto.serve import ServeConfig
from mizuoto.serve import ray as ray_serve


@pytest.fixture
def own_handlers():
    """run() sets SIGINT/SIGTERM handlers (and ignores SIGINT at its end): put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("swallowed", [True, False])
def test_a_ctrl_c_while_starting_stops_even_when_ray_swallows_it(monkeypatch, own_handlers,
                                                                  swallowed):
    started = []

    def start(config, settings):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here (main thread) and raises
        except KeyboardInterrupt:
            if not swallowed:
                raise
        started.append(True)  # Ray lost the exception: the start carried on and returned

    monkeypatch.setattr(ray_serve, "start", start)
    monkeypatch.setattr("ray.is_initialized", lambda: False)  # nothing to take down here
    # without the fix run() would serve until a signal: this one ends it after 10 s at most
    backstop = threading.Timer(10, os.kill, (os.getpid(), signal.SIGTERM))
    backstop.start()
    began = time.monotonic()
    try:
        ray_serve.run(ServeConfig(models={"m": "x"}), ray_serve.RaySettings())
    finally:
        backstop.cancel()
    assert time.monotonic() - began < 5
    assert started == ([True] if swallowed else [])


def test_serving_gives_the_wakeup_fd_back(monkeypatch, own_handlers):
    """The interrupt watch only watches the start: once serving, the wakeup fd is what it was
    (a graceful stop may take the replicas' grace, which no deadline cuts short)."""
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    during = []

    def start(config, settings):
        during.append(signal.set_wakeup_fd(-1))
        signal.set_wakeup_fd(during[0])  # the watch's, put back as found

    monkeypatch.setattr(ray_serve, "start", start)
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    stopper = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    stopper.start()
    try:
        ray_serve.run(ServeConfig(models={"m": "x"}), ray_serve.RaySettings())
    finally:
        stopper.cancel()
    assert during and during[0] not in (-1, before)  # watched while starting
    assert signal.set_wakeup_fd(before) == before  # and given back once serving


_HUNG_START = """
import logging, signal, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from mizuoto.serve import ServeConfig
from mizuoto.serve import ray as ray_serve

def start(config, settings):
    # Ray's part of a start that never returns and loses the interrupt: its own handler
    signal.signal(signal.SIGINT, lambda *_: None)
    print("starting", flush=True)
    while True:
        time.sleep(0.1)

ray_serve.start = start
ray_serve.STOP_LIMIT = float(sys.argv[1])
import ray
ray.is_initialized = lambda: False
ray_serve.run(ServeConfig(models={"m": "x"}), ray_serve.RaySettings())
"""


def test_a_start_that_never_returns_after_a_ctrl_c_still_ends_the_command():
    """Ray can hang inside its start after a Ctrl-C and keep the interrupt from Python: the
    command exits on its own STOP_LIMIT seconds later (status 130), saying why."""
    import subprocess
    import sys

    limit = 2.0
    child = subprocess.Popen([sys.executable, "-c", _HUNG_START, str(limit)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "starting"
        interrupted = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert limit <= took < limit + 30
    assert "did not stop within 2 s of the interrupt: exiting now" in err
