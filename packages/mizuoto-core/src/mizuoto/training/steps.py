"""The skeleton of a training loop: what happens around each optimiser update.

A trainer supplies ``update()``, one whole optimiser update (its micro-batches, clipping, the
optimiser and schedule steps) returning the values it logs, and ``save()``, which writes the
resumable checkpoint (called on every process: it may be a collective). `StepLoop.run` then,
after each update: logs the values (`MetricsLog`, process 0), saves every ``save_every``
updates and after the last, calls ``numbered(done)`` every ``checkpoint_every`` updates when
numbered checkpoints are kept, ``samples(done)`` (process 0: audio samples, which must draw no
number of the run's own generators) every ``samples_every`` updates, reports progress with
loss, rate and ETA (after the saves: an update reported is on disk when its save was due, as
the trainer contract asks), and asks the interruption (`mizuoto.runtime.interruption`) at every update but the last: on SIGINT
or SIGTERM it saves (unless just saved) and stops. Nothing here draws a random number, so
moving a loop onto it keeps its bytes.

`micro_batches(count, no_sync)` is the accumulation: ``count`` micro-batch contexts, all but the
last skipping the gradient all-reduce (DDP's ``no_sync``) in a multi-process run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping

import attrs

from mizuoto.runtime.interruption import catch_interruption
from mizuoto.training.metrics import MetricsLog
from mizuoto.training.progress import StepProgress
from mizuoto.training.world import ProcessWorld

logger = logging.getLogger(__name__)


@attrs.frozen
class Cadence:
    """How often a run saves: ``save_every`` updates (the resumable checkpoint), and
    ``checkpoint_every`` updates a numbered one when ``keep_checkpoints`` is not 0."""

    save_every: int
    checkpoint_every: int = 0
    keep_checkpoints: int = 0
    #: updates between audio samples (0: none)
    samples_every: int = 0

    def numbered_due(self, done: int) -> bool:
        return self.keep_checkpoints != 0 and done % self.checkpoint_every == 0

    def samples_due(self, done: int) -> bool:
        return self.samples_every > 0 and done % self.samples_every == 0


@attrs.frozen
class LoopOutcome:
    done: int
    interrupted: str | None = None


def micro_batches(count: int, no_sync: Callable[[], contextlib.AbstractContextManager] | None
                  = None) -> Iterator[tuple[int, contextlib.AbstractContextManager]]:
    """``(index, context)`` per micro-batch of an update; the context skips the gradient
    all-reduce on all but the last (``no_sync`` None: never)."""
    for index in range(count):
        last = index == count - 1
        yield index, (contextlib.nullcontext() if last or no_sync is None else no_sync())


def warn_long_warmup(setting: str, warmup: int, *, steps: int, schedule: int | None = None,
                     learning_rate: float) -> bool:
    """Warn, in the same words for every trainer, when the warm-up (``setting``, as the user
    names it) outlasts the updates the run makes (``--steps``; ``schedule``: the updates the
    learning-rate schedule spans, where that differs). Upstream runs it: the rate rises all
    run. Returns whether it warned."""
    made = steps if schedule is None else min(steps, schedule)
    if warmup <= made:
        return False
    spans = "" if schedule is None or schedule == steps else \
        f"; the schedule spans {schedule} updates"
    logger.warning("%s %d exceeds the %d updates this run makes (--steps %d%s): the learning "
                   "rate rises all run and never reaches %g (upstream's behaviour); to reach "
                   "it, pass --param %s=N with N at most %d", setting, warmup, made, steps,
                   spans, learning_rate, setting, made)
    return True


class StepLoop:
    """See the module doc. ``start``: updates already made (a resumed run); ``total``: the
    run's updates; ``finished``: whether the run is over (default: ``done >= total``);
    ``count_from``: the number the first update is logged under (0: step indices, 1: update
    numbers); ``stop_device``: where the interruption's all-reduce runs."""

    def __init__(self, *, start: int, total: int, cadence: Cadence, world: ProcessWorld,
                 save: Callable[[int], None],
                 numbered: Callable[[int], None] | None = None,
                 samples: Callable[[int], None] | None = None,
                 metrics: MetricsLog | None = None, progress: StepProgress | None = None,
                 finished: Callable[[int], bool] | None = None, count_from: int = 0,
                 stop_device=None) -> None:
        self.done = start
        self.total = total
        self.cadence = cadence
        self.world = world
        self._save = save
        self._numbered = numbered
        self._samples = samples if world.main else None
        self.metrics = metrics if world.main else None
        self.progress = progress if world.main else None
        self.finished = finished or (lambda done: done >= total)
        self.count_from = count_from
        self.stop_device = stop_device
        self.saved = start if start > 0 else None  # the update the checkpoint on disk holds
        self.values: dict[str, float] = {}  # the last update's

    def save_now(self) -> None:
        """Save the checkpoint unless it already holds this update (every process)."""
        if self.saved != self.done:
            self._save(self.done)
            self.saved = self.done

    def run(self, update: Callable[[], Mapping[str, float]],
            after: Callable[[int, dict[str, float]], None] | None = None) -> LoopOutcome:
        """Train to the end. ``after(done, values)`` runs after each update's log line is
        ready and before it is written (e.g. validation adding its values)."""
        interrupted = None
        with catch_interruption() as interruption:
            while not self.finished(self.done):
                values = self.values = dict(update())
                self.done += 1
                if after is not None:
                    after(self.done, values)
                if self.metrics is not None:
                    self.metrics.log(self.done - 1 + self.count_from, values)
                last = self.finished(self.done)
                if self.done % self.cadence.save_every == 0 or last:
                    self.save_now()
                if self._numbered is not None and self.cadence.numbered_due(self.done):
                    self._numbered(self.done)
                if self._samples is not None and self.cadence.samples_due(self.done):
                    if interruption.received is not None:  # the stop waits: say why
                        logger.info("%s: writing the audio samples of update %d before "
                                    "stopping (the trainer's samples setting turns them off)",
                                    interruption.received, self.done)
                    self._samples(self.done)
                if self.progress is not None:  # after the saves: update N reported is on disk
                    self.progress(self.done, values)
                if not last:  # every process asks, at every update
                    interrupted = interruption.stop_now(self.stop_device)
                    if interrupted is not None:
                        break
        self.save_now()
        if self.metrics is not None:
            self.metrics.flush()
        return LoopOutcome(self.done, interrupted)
