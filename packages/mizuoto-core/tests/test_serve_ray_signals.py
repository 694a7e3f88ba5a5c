"""``mizuoto serve --ray``'s Ctrl-C handling while it starts, without starting Ray: a Ctrl-C
whose KeyboardInterrupt Ray loses inside its start (it defers SIGINT in its task submission)
still stops the command once the start returns, instead of serving until a second signal."""

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
