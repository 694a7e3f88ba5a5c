"""Optional features an engine declares by subclassing, beside its capabilities.

A capability (:class:`~mizuoto.contracts.capabilities.Capability`) is what a loaded model can
do with a request; a feature is a way the engine itself can be driven, with methods of its
own. An engine declares one by naming it among its bases, and the front ends ask the contract
(:func:`lora_engine`, :func:`batching_engine`), never the engine's attributes::

    class MyEngine(Engine, SupportsLoRA, SupportsBatching): ...

- :class:`SupportsLoRA`: ``set_lora(path)`` applies a LoRA directory over the loaded weights,
  ``lora`` says which is applied (the CLI's ``say --lora``); ``is_lora_export(directory)``
  tells the engine's LoRA exports (``serve --ray --lora-dir``) by their files.
- :class:`SupportsBatching`: concurrent requests of one loaded model step together. The
  server's ``--max-batch N`` asks the engine class for the options that make a model batch up
  to N (:meth:`~SupportsBatching.batch_options`, before it loads), runs as many requests of the
  model at once as the loaded engine batches (:attr:`~SupportsBatching.max_batch`), and shows
  its :attr:`~SupportsBatching.batch_stats` on ``/metrics``.
- :class:`SupportsSteps`: the engine's generation is a step over a set of requests; the
  core's scheduler (:mod:`mizuoto.contracts.scheduler`) admits, batches, takes turns and
  cancels. It is a :class:`SupportsBatching` whose batching the core does.

An engine that declares neither is served and spoken with as before: one request at a time,
and ``--lora`` refused naming the flag.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mizuoto.contracts.results import Rendered
from mizuoto.contracts.scheduler import DEFAULT_MAX_ROWS, scheduler_for
from mizuoto.errors import InvalidRequest


class SupportsLoRA(abc.ABC):
    """An engine that applies LoRA adapters to its loaded weights, without reloading them."""

    @property
    @abc.abstractmethod
    def lora(self) -> object | None:
        """The LoRA applied now (the engine's own description of it), or None."""

    @abc.abstractmethod
    def set_lora(self, path: str | Path | None) -> None:
        """Apply the LoRA directory ``path``, replacing the current one; ``None`` removes it."""

    @classmethod
    def is_lora_export(cls, directory: Path) -> bool:
        """Whether ``directory`` is a LoRA export of this engine: a model folder that loads
        with its LoRA applied (``serve --ray --lora-dir`` serves each as a model). By default
        False: an engine that does not say how its exports look is offered none."""
        return False


class SupportsBatching(abc.ABC):
    """An engine that steps concurrent requests of one loaded model together.

    A row never depends on its batch mates: their seeds, texts or number change none of its
    samples where :attr:`batch_exact` holds (its audio is then the request's alone, bit for
    bit), and where it does not, only the bits of batched kernels may differ: never which
    noise a row draws (each row draws from its own generator, seeded with its own seed).
    """

    #: Whether a batched row's audio equals the same request's alone, bit for bit (the
    #: contract suite checks it); ``False`` for an engine whose batched kernels round
    #: differently, whose rows must still not depend on their batch mates' seeds.
    batch_exact: bool = True

    @classmethod
    @abc.abstractmethod
    def batch_options(cls, section: Mapping[str, Any], max_batch: int) -> dict[str, Any]:
        """The engine's options section (``engines.<name>.*``, as given) with what makes a
        loaded model batch up to ``max_batch`` requests; what ``section`` sets already wins."""

    @property
    @abc.abstractmethod
    def max_batch(self) -> int:
        """The most requests the loaded model steps together (1: it does not batch)."""

    @property
    @abc.abstractmethod
    def batch_stats(self) -> object | None:
        """What batching has done so far (``steps``, ``rows``, ``seconds``, ``last_size``), or
        None while the model does not batch."""


class SupportsSteps(SupportsBatching):
    """An engine whose generation is a step over a set of requests (rows): the core's
    scheduler opens a row per request, advances the open rows one step together (rows join
    and leave between steps: continuous batching), hands each row's chunks to its request and
    closes a row when its last chunk is made or its client leaves (within one step). The
    engine writes these three methods, no lock and no thread; the base class's ``stream`` and
    ``synthesize`` run through the scheduler (the engine writes no ``_stream``), so a request
    spoken alone runs the same steps as in a batch. The scheduler is the engine's scheduling
    object (:mod:`mizuoto.contracts.scheduling`): nothing else to declare.

    A row's audio must not depend on its batch mates where the arithmetic allows it (the
    contract suite checks batched == alone in float32): keep each row's generator in its
    state and draw only from it."""

    #: Rows stepped together (``mizuoto serve --max-batch N`` sets N on a served model).
    max_rows: int = DEFAULT_MAX_ROWS
    #: The setting that bounds :attr:`max_rows`, named when a request would wait for a row
    #: only its own thread can free (``"engines.voxcpm.cache_slots"``); None: none.
    rows_setting: str | None = None
    #: The most seconds a step that admits requests waits for others arriving with them
    #: (:data:`~mizuoto.contracts.scheduler.ARRIVAL_QUIET` of quiet ends it sooner): worth a
    #: few hundredths of a second where rows batch, 0 where they only take turns.
    admission_wait: float = 0.0

    @abc.abstractmethod
    def open_row(self, request, params, generator) -> Any:
        """A planned request's state (its text, params, and ``generator``, from which every
        random draw of the row comes). Runs in the caller's thread: refuse a request here."""

    @abc.abstractmethod
    def step_rows(self, rows: Sequence[Any]) -> Sequence[Sequence[Rendered]]:
        """Advance every row of ``rows`` one step together; for each row, in order, the
        chunks ready now (none, one or several; a request's last has ``last=True``, and its
        row is then closed), or an exception: that row's own failure (its context full),
        which ends it alone; an exception raised ends every row of the step."""

    def close_row(self, row: Any) -> None:
        """Release ``row``'s state: its last chunk made, cancelled, or failed."""

    def row_progress(self, row: Any) -> tuple[str, int, int | None] | None:
        """What the scheduler reports to the request's progress callback after each step
        (stage, done, total: ``("sampling", 12, 40)``); None: ``("step", steps, None)``."""
        return None

    @classmethod
    def batch_options(cls, section: Mapping[str, Any], max_batch: int) -> dict[str, Any]:
        return dict(section)  # the rows are the core's: set on the loaded engine (max_rows)

    @property
    def max_batch(self) -> int:
        return self.max_rows

    @property
    def batch_stats(self) -> object | None:
        return scheduler_for(self).stats


def stepping_engine(engine) -> SupportsSteps | None:
    """``engine`` (an engine or its class), if it declares :class:`SupportsSteps`."""
    kind = engine if isinstance(engine, type) else type(engine)
    return engine if issubclass(kind, SupportsSteps) else None


def lora_engine(engine, field: str = "lora") -> SupportsLoRA:
    """``engine``, if it declares :class:`SupportsLoRA`; else an :class:`InvalidRequest` for
    ``field`` (the CLI passes ``--lora``)."""
    if not isinstance(engine, SupportsLoRA):
        raise InvalidRequest(field, f"engine {engine.name!r} does not apply LoRAs",
                             "use an engine that does (VoxCPM), or leave it out")
    return engine


def batching_engine(engine) -> SupportsBatching | None:
    """``engine`` (an engine or its class), if it declares :class:`SupportsBatching`."""
    kind = engine if isinstance(engine, type) else type(engine)
    return engine if issubclass(kind, SupportsBatching) else None
