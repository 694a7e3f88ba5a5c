"""A batch as a Ray Data pipeline (``pip install "mizuoto-core[ray]"``).

The lines go into a dataset; ``map_batches`` runs :class:`SpeakLines`, a callable class, so
each Ray actor loads the model once (``ActorPoolStrategy``) and writes its lines' files with
:func:`~mizuoto.batch.run.speak_line`, the function the local backends run: the files are
the same, byte for byte, for the same seeds and thread counts. Retries, placement and
back-pressure are Ray's. Outputs go to ``OUT`` as each actor sees it: on a cluster, a
filesystem every node mounts.

On a small machine give the actors a fraction of a CPU (``num_cpus=0.5``): at one CPU each,
two actors on two cores leave none for Ray's read tasks and the pipeline stalls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs

from mizuoto.batch.items import BatchLine
from mizuoto.batch.run import BatchJob, ModelLoader, speak_line
from mizuoto.errors import InvalidRequest
from mizuoto.runtime.ray_temp import local_ray_temp_dir


@attrs.frozen
class RaySettings:
    """``address``: a cluster (``ray://host:10001``, ``auto``) or ``None`` for a local instance
    (started if none is running). ``actors``: model copies; ``num_cpus`` / ``num_gpus`` per
    actor; ``batch_size``: lines per call."""

    address: str | None = None
    actors: int = attrs.field(default=2, validator=lambda *a: _check(*a, "--ray-actors", 1))
    num_cpus: float = attrs.field(default=0.5,
                                  validator=lambda *a: _check(*a, "--ray-cpus", 0, open_=True))
    num_gpus: float = attrs.field(default=0.0,
                                  validator=lambda *a: _check(*a, "--ray-gpus", 0))
    batch_size: int = attrs.field(default=1, validator=lambda *a: _check(*a, "batch_size", 1))


def _check(instance, attribute, value, option: str, low: float, *, open_: bool = False) -> None:
    """A finite number of at least ``low`` (above it with ``open_``): Ray's own check comes
    late, as a traceback, and lets NaN through."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < low or (open_ and value == low):
        bound = f"above {low}" if open_ else f"at least {low}"
        raise InvalidRequest(f"{attribute.name} ({option})",
                             f"must be a finite number {bound}, got {value!r}")


class SpeakLines:
    """A Ray actor: loads the model once, then speaks the lines of each batch it is given."""

    def __init__(self, loader: ModelLoader, job: BatchJob) -> None:
        self.engine = loader()
        self.job = job

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        records = []
        for raw in batch["line"]:
            line, previous = _unpack(raw)
            records.append(json.dumps(speak_line(self.engine, self.job, line, previous),
                                      ensure_ascii=False, default=repr))
        return {"record": records}


def ray_records(loader: ModelLoader, settings: RaySettings):
    """The ``records`` backend of :func:`~mizuoto.batch.run.run_batch` on Ray."""

    def records(job: BatchJob, pending: list[tuple[BatchLine, dict | None]]
                ) -> Iterator[dict[str, Any]]:
        try:
            import ray
            from ray.data import ActorPoolStrategy
        except ImportError:
            raise InvalidRequest("--ray", "needs Ray", 'pip install "mizuoto-core[ray]"') \
                from None
        for line, previous in pending:  # unreadable lines need no model
            if line.error is not None:
                yield speak_line(None, job, line, previous)
        pending = [(line, previous) for line, previous in pending if line.error is None]
        if not pending:
            return
        if not ray.is_initialized():
            local = {} if settings.address not in (None, "local") else local_ray_temp_dir()
            ray.init(address=settings.address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False, **local)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the batch's own "lines" progress reports
        context.print_on_execution_start = False
        rows = [{"line": _pack(line, previous)} for line, previous in pending]
        blocks = min(len(rows), settings.actors * 4)
        dataset = ray.data.from_items(rows, override_num_blocks=blocks).map_batches(
            SpeakLines, fn_constructor_kwargs={"loader": loader, "job": job},
            batch_size=settings.batch_size, compute=ActorPoolStrategy(size=settings.actors),
            num_cpus=settings.num_cpus, num_gpus=settings.num_gpus or None)
        for row in dataset.iter_rows():
            yield json.loads(row["record"])

    return records


def _pack(line: BatchLine, previous: dict | None) -> str:
    return json.dumps({"number": line.number, "id": line.id, "fields": line.fields,
                       "previous": previous}, ensure_ascii=False, default=repr)


def _unpack(raw: str) -> tuple[BatchLine, dict | None]:
    data = json.loads(raw)
    return BatchLine(data["number"], data["id"], data["fields"]), data["previous"]
