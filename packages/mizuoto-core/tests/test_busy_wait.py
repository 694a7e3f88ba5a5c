"""A caller bounds how long an engine's call waits for capacity; each thread on its own."""

from __future__ import annotations

import threading

import pytest

from mizuoto.runtime.busy_wait import busy_wait, waiting_at_most


def test_the_engines_default_unless_a_caller_bounds_it():
    assert busy_wait(30.0) == 30.0
    with waiting_at_most(0):
        assert busy_wait(30.0) == 0.0
        with waiting_at_most(2):
            assert busy_wait(30.0) == 2.0
        assert busy_wait(30.0) == 0.0
    assert busy_wait(30.0) == 30.0


def test_a_bound_holds_in_its_own_thread_only():
    seen = []
    with waiting_at_most(0):
        thread = threading.Thread(target=lambda: seen.append(busy_wait(30.0)))
        thread.start()
        thread.join()
    assert seen == [30.0]


@pytest.mark.parametrize("seconds", [-1, float("nan")])
def test_a_negative_or_nan_wait_is_refused(seconds):
    with pytest.raises(ValueError, match="0 seconds or more"), waiting_at_most(seconds):
        pass
