"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler, ``kill``,
torchrun): the signal is recorded instead of ending the process, and the loop, at its next
update boundary, saves its checkpoint as a periodic save does and returns.

``with catch_interruption() as interruption:`` installs the handlers (in the main thread only:
elsewhere nothing is caught and the run never stops early), and restores the previous ones on
exit. After each completed optimiser update (never between accumulated micro-batches) the loop
asks ``interruption.stop_now()``: the name of the signal to stop for, or None. Under
torch.distributed every process must ask at the same update: the flags are all-reduced (max),
so all processes stop at the same update (else their next collective would wait forever).

While a stop is pending, a further SIGTERM changes nothing (torchrun forwards one after the
terminal's Ctrl-C) and a further SIGINT aborts at once (``KeyboardInterrupt``), as a second
Ctrl-C does elsewhere. A signal the process ignores (``SIG_IGN``, e.g. SIGINT in a background
job) stays ignored.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interruption:
    """A request to stop a training run, recorded from a signal; see the module's doc."""

    def __init__(self) -> None:
        #: the first stop signal received (``"SIGINT"``, ``"SIGTERM"``), or None
        self.received: str | None = None

    def handle(self, signum: int, frame: Any = None) -> None:
        """The signal handler: record the first signal; a SIGINT after it aborts."""
        name = signal.Signals(signum).name
        if self.received is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.received = name
        logger.warning("%s received: stopping after the current update and saving the "
                       "checkpoint%s", name,
                       "; press Ctrl-C again to abort without saving"
                       if signum == signal.SIGINT else "")

    def stop_now(self, device: Any = None) -> str | None:
        """The signal to stop for at this update boundary, or None.

        In a process group of more than one process this is a collective: every process calls
        it at the same update and all get the same answer (a signal any of them received; the
        highest-numbered when they differ). ``device``: where the one-number all-reduce runs
        (a CUDA device for NCCL; default: the CPU, or ``cuda:LOCAL_RANK`` under NCCL).
        """
        code = 0 if self.received is None else int(signal.Signals[self.received])
        if _process_group_size() > 1:
            code = _all_reduce_max(code, device)
        return None if code == 0 else signal.Signals(code).name


@contextlib.contextmanager
def catch_interruption(signals: tuple[signal.Signals, ...] = STOP_SIGNALS
                       ) -> Iterator[Interruption]:
    """Record ``signals`` (SIGINT and SIGTERM) in the yielded `Interruption` while the block
    runs, in the main thread; the previous handlers come back when it ends."""
    interruption = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield interruption
        return
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in signals:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue
            previous[signum] = signal.signal(signum, interruption.handle)
        yield interruption
    finally:
        for signum, handler in previous.items():
            # None: a handler installed outside Python, which cannot be put back; the default
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def exit_status(signal_name: str) -> int:
    """A shell's exit status for a process ended by ``signal_name``: 128 + its number
    (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signal.Signals[signal_name])


def _process_group_size() -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def _all_reduce_max(code: int, device: Any) -> int:
    import os

    import torch
    import torch.distributed as dist

    if device is None:
        device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
    flag = torch.tensor([code], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())
