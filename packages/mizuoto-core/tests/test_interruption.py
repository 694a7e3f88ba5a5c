"""Stopping a training run on SIGINT / SIGTERM (`mizuoto.runtime.interruption`): handlers
recorded and restored, a second Ctrl-C aborts, processes agree on the update to stop at."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from mizuoto.runtime.interruption import catch_interruption, exit_status


def test_signals_are_recorded_then_the_previous_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with catch_interruption() as interruption:
        assert interruption.stop_now() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert interruption.stop_now() == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # already stopping: nothing more
        assert interruption.received == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.fixture
def interactive_sigint():
    """Python's own SIGINT handler, as in a terminal: a test runner started as a background job
    inherits SIGINT ignored, which catch_interruption rightly leaves alone."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_second_ctrl_c_aborts_at_once(interactive_sigint):
    with pytest.raises(KeyboardInterrupt):
        with catch_interruption() as interruption:
            os.kill(os.getpid(), signal.SIGINT)
            assert interruption.stop_now() == "SIGINT"
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the second SIGINT did not abort")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with catch_interruption() as interruption:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert interruption.stop_now() is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_nothing_is_caught():
    seen = []

    def body():
        with catch_interruption() as interruption:
            seen.append((signal.getsignal(signal.SIGTERM), interruption.stop_now()))

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen == [(signal.SIG_DFL, None)]


def test_exit_status_is_the_shells():
    assert exit_status("SIGINT") == 130 and exit_status("SIGTERM") == 143


_TWO_PROCESSES = """
import os, signal, sys
import torch.distributed as dist
from mizuoto.runtime.interruption import catch_interruption
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=int(sys.argv[2]),
                        world_size=2)
answers = []
with catch_interruption() as interruption:
    for update in range(1, 6):
        if update == 3 and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        answers.append(interruption.stop_now())
        if answers[-1]:
            break
print(dist.get_rank(), answers)
dist.destroy_process_group()
"""


def test_processes_agree_on_the_update_to_stop_at(tmp_path):
    """Only process 1 receives SIGTERM; both stop after update 3 (gloo all-reduce)."""
    script = textwrap.dedent(_TWO_PROCESSES)
    rendezvous = tmp_path / "rendezvous"
    children = [subprocess.Popen([sys.executable, "-c", script, str(rendezvous), str(rank)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
                for rank in (0, 1)]
    outputs = [child.communicate(timeout=120) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err[-2000:]
    answers = "[None, None, 'SIGTERM']"
    assert sorted(out.strip() for out, _ in outputs) == [f"0 {answers}", f"1 {answers}"]
