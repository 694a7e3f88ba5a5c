"""Running a batch: each line to ``OUT/<id>.<ext>``, its record to ``OUT/manifest.jsonl``.

:func:`speak_line` is the whole work of one line, the same in every backend (this process,
``workers`` local processes, Ray actors), so that the files are the same whichever runs them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto.audio_formats import FORMATS, format_named
from mizuoto.batch.items import BatchLine, build_order, count_lines, read_lines
from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.contracts.results import SynthesisResult
from mizuoto.errors import InvalidRequest, MizuotoError
from mizuoto.identity import digest, file_digest, model_identity, request_identity
from mizuoto.runtime.run_lock import RunLock
from mizuoto.service import plan_speech, speak

if TYPE_CHECKING:
    from mizuoto.contracts.engine import Engine
    from mizuoto.options import Options

log = logging.getLogger(__name__)

MANIFEST = "manifest.jsonl"
#: The lock a running batch holds in its output folder (removed when it ends).
LOCK = ".mizuoto-batch.lock"
#: Most local worker processes (each loads its own model copy): far above any machine's
#: useful count, far below a typo that would spawn processes until the machine stops.
MAX_WORKERS = 256


@attrs.frozen
class BatchSummary:
    """How a batch went: lines ``ok`` (written now), ``skipped`` (already written by an
    earlier run with the same request) and ``failed``; the manifest's path."""

    ok: int
    skipped: int
    failed: int
    manifest: Path
    elapsed: float

    @property
    def lines(self) -> int:
        return self.ok + self.skipped + self.failed


@attrs.frozen
class BatchJob:
    """What every line of a batch shares: where its input is, where outputs go, the format
    (a name of :data:`mizuoto.audio_formats.FORMATS`), and request defaults (``steps``,
    ``guidance``, ``params``)."""

    # absolute: Ray actors and worker processes need not share this process's directory
    input: Path = attrs.field(converter=lambda p: Path(p).absolute())
    output_dir: Path = attrs.field(converter=lambda p: Path(p).absolute())
    format: str = attrs.field(default="wav",
                              converter=lambda value: value.lower() if isinstance(value, str)
                              else value)
    defaults: dict[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        format_named(self.format, "format")

    def output_path(self, line_id: str) -> Path:
        """Where the line with ``line_id`` is written: ``OUT/<id><the format's extension>``."""
        return self.output_dir / f"{line_id}{FORMATS[self.format].extension}"


def speak_line(engine: Engine, job: BatchJob, line: BatchLine,
               previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Synthesize one line through the speech service (its order, planned once by
    ``engine``, the seed drawn there when the line sets none) and write its file atomically;
    return its manifest record.

    A line whose ``previous`` record is ``ok`` with the same request hash, and whose file is
    still there, is not synthesized again (``"resumed": true``). Any error (a bad field, a
    missing file, an engine failure) becomes the record's ``error``; only an interruption
    (``KeyboardInterrupt``) propagates.
    """
    record: dict[str, Any] = {"line": line.number, "id": line.id}
    started = time.monotonic()
    try:
        order = build_order(line, base=job.input.parent, defaults=job.defaults)
        path = job.output_path(line.id)
        key = digest({"model": model_identity(engine),
                      "request": request_identity(order.request), "format": job.format})
        if _still_written(previous, key, path):
            return {**previous, "line": line.number, "resumed": True}
        [whole] = speak(engine, plan_speech(engine, order), stream=False)
        result = SynthesisResult(whole.audio, whole.applied)
        result.save(path)
        written = file_digest(path)
    except Exception as exc:  # any failure is this line's, not the batch's
        return {**record, "status": "error", "error": _error(exc)}
    applied = attrs.asdict(result.applied, recurse=False)
    applied.update(sampler=dict(result.applied.sampler), extra=dict(result.applied.extra),
                   compute=dict(result.applied.compute),
                   model_defaults=dict(result.applied.model_defaults),
                   fallbacks=list(result.applied.fallbacks),
                   warnings=list(result.applied.warnings))
    return {**record, "status": "ok", "path": path.name, "hash": key, "sha256": written,
            "seconds": round(result.audio.duration, 6),
            "elapsed": round(time.monotonic() - started, 3), "applied": applied}


def _still_written(previous: dict[str, Any] | None, key: str, path: Path) -> bool:
    """Whether ``previous`` (an earlier run's record of this id) made this request and the
    file beside the manifest is still the one it wrote (its SHA-256): only then is the line
    skipped, so a record never vouches for a file another run or request left there."""
    if not previous or previous.get("status") != "ok" or previous.get("hash") != key:
        return False
    return path.is_file() and previous.get("sha256") == file_digest(path)


def _error(exc: BaseException) -> dict[str, Any]:
    error = {"type": type(exc).__name__, "message": str(exc)}
    field = getattr(exc, "field", None) or getattr(exc, "key", None)
    if field:
        error["field"] = field
    return error


class Manifest:
    """``manifest.jsonl``: records are appended as lines finish (a killed batch keeps what it
    did), then :meth:`compact` rewrites it atomically with one record per input line, in
    input order."""

    def __init__(self, output_dir: Path) -> None:
        self.path = Path(output_dir) / MANIFEST
        self.previous = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        """The last ``ok`` record of each id (what a rerun may skip)."""
        records: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as handle:
                for raw in handle:
                    try:
                        record = json.loads(raw)
                    except ValueError:  # a line cut short by a kill
                        continue
                    if isinstance(record, dict) and record.get("status") == "ok":
                        records[str(record["id"])] = record
        return records

    def __enter__(self) -> Manifest:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")
        self.records: dict[int, dict[str, Any]] = {}  # by line number: ids may repeat
        return self

    def add(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
        self._handle.flush()
        self.records[record["line"]] = record

    def __exit__(self, *exc_info) -> None:
        self._handle.close()

    def compact(self, order: Iterable[BatchLine]) -> None:
        from mizuoto.runtime.atomic import atomic_path

        with atomic_path(self.path) as tmp, open(tmp, "w", encoding="utf-8") as out:
            for line in order:
                record = self.records.get(line.number)
                if record is not None:
                    out.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")


def run_batch(job: BatchJob, *, engine: Engine | None = None, load: Callable[[], Engine] | None
              = None, workers: int = 1, progress: ProgressCallback | None = None,
              records: Callable[[BatchJob, list[tuple[BatchLine, dict | None]]],
                                Iterator[dict[str, Any]]] | None = None) -> BatchSummary:
    """Run every line of ``job``. Pass a loaded ``engine`` (one process), or ``load`` (called
    once per worker) with ``workers`` > 1; ``records`` replaces the backend (see
    :mod:`mizuoto.batch.ray`). A ``lines`` progress stage counts lines, with ``detail`` the
    failures so far.

    One batch at a time writes a folder: a second run into it raises
    :class:`~mizuoto.errors.InvalidRequest` naming the first (pid and host)."""
    if isinstance(workers, bool) or not isinstance(workers, int) \
            or not 1 <= workers <= MAX_WORKERS:
        raise InvalidRequest("workers", f"must be an integer in [1, {MAX_WORKERS}], got "
                             f"{workers!r}")
    started = time.monotonic()
    total = count_lines(job.input)
    with RunLock(job.output_dir / LOCK, field="output_dir", what=str(job.output_dir)):
        ok, skipped, failed = _run_lines(job, engine, load, workers, progress, records, total)
    return BatchSummary(ok, skipped, failed, job.output_dir / MANIFEST,
                        time.monotonic() - started)


def _run_lines(job: BatchJob, engine: Engine | None, load, workers: int,
               progress: ProgressCallback | None, records, total: int) -> tuple[int, int, int]:
    """Every line through the chosen backend, each record into the manifest as it comes."""
    ok = skipped = failed = 0
    report(progress, "lines", 0, total)
    with Manifest(job.output_dir) as manifest:
        pending = ((line, manifest.previous.get(line.id)) for line in read_lines(job.input))
        if records is not None:
            stream = records(job, list(pending))
        elif workers > 1:
            stream = _in_workers(job, pending, load, workers)
        else:
            if engine is None:
                engine = load()
            stream = (speak_line(engine, job, line, previous) for line, previous in pending)
        for record in stream:
            manifest.add(record)
            if record["status"] != "ok":
                failed += 1
                log.warning("line %s (%s): %s", record["line"], record["id"],
                            record["error"]["message"])
                last = f"{record['id']} failed"
            elif record.get("resumed"):
                skipped += 1
                last = f"{record['id']} already done"
            else:
                ok += 1
                last = f"{record['id']}: {record.get('seconds', 0):.1f} s of audio in " \
                       f"{record.get('elapsed', 0):.1f} s"
            # the detail names the line just finished: a log gets one line per batch line
            report(progress, "lines", ok + skipped + failed, total,
                   last + (f"; {failed} failed" if failed else ""))
    manifest.compact(read_lines(job.input))
    return ok, skipped, failed


# -- local worker processes -----------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _in_workers(job: BatchJob, pending: Iterator[tuple[BatchLine, dict | None]], load,
                workers: int) -> Iterator[dict[str, Any]]:
    """Lines spread over ``workers`` processes, each loading the model once; at most two
    lines per worker in flight, records yielded as lines finish."""
    import concurrent.futures
    import multiprocessing

    if load is None:
        raise InvalidRequest("workers", "needs a loader (load=...) to load the model in each "
                             "worker")
    context = multiprocessing.get_context("spawn")
    slots = context.Queue()
    for slot in range(workers):
        slots.put(slot)
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                                    initializer=_start_worker,
                                                    initargs=(load, job, slots)) as pool:
            in_flight: set = set()
            for line, previous in pending:
                if line.error is not None:  # unreadable: no model needed (errors do not pickle)
                    yield speak_line(None, job, line, previous)
                    continue
                in_flight.add(pool.submit(_work, line, previous))
                if len(in_flight) >= 2 * workers:
                    done, in_flight = concurrent.futures.wait(
                        in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                    yield from (future.result() for future in done)
            for future in concurrent.futures.as_completed(in_flight):
                yield future.result()
    except concurrent.futures.process.BrokenProcessPool:
        # a worker died loading the model or in it (its own error went to its stderr)
        raise MizuotoError("a batch worker process failed to start or died; the lines it had "
                           "are not recorded: rerun with --workers 1 to see its error "
                           "(finished lines are kept and skipped)") from None


def _start_worker(load, job: BatchJob, slots) -> None:
    slot = slots.get()
    os.environ["MIZUOTO_WORKER"] = str(slot)
    _WORKER.update(engine=load(slot), job=job)


def _work(line: BatchLine, previous: dict | None) -> dict[str, Any]:
    return speak_line(_WORKER["engine"], _WORKER["job"], line, previous)


@attrs.frozen
class ModelLoader:
    """Loads ``model`` with ``options`` in a worker (picklable). Worker ``slot`` of several on
    a machine with CUDA devices gets ``cuda:<slot mod count>`` when the device is ``auto`` or
    ``cuda``; on the CPU each worker gets an equal share of the cores unless
    ``compute.cpu_threads`` is set."""

    model: str = attrs.field(converter=str)
    engine: str | None = None
    # kept as plain mappings: Options hold mapping proxies, which do not pickle
    options: dict[str, Any] = attrs.field(factory=dict, converter=lambda o: _plain_options(o))
    workers: int = 1

    def check(self, params: dict[str, Any] | None = None) -> None:
        """What loading checks first (the model is there, an engine loads it, the options
        suit it), in this process: before any worker starts, so that a missing model is exit
        code 3 at once, not a broken worker pool later. ``params`` (the params every line
        gets) are checked too, as :meth:`Engine.plan` checks a line's: their keys
        (:func:`~mizuoto.contracts.engine.check_param_keys`) and, over the model directory's
        defaults, their values: a bad one would fail every line."""
        from mizuoto.contracts.engine import check_param_keys, parses_params_by_class
        from mizuoto.contracts.model_defaults import read_model_defaults
        from mizuoto.loading import resolve_engine
        from mizuoto.options import Options
        from mizuoto.validation import parse_attrs

        engine_cls, resolved = resolve_engine(self.model, engine=self.engine,
                                              options=Options.from_mapping(self.options))
        check_param_keys(engine_cls, params)
        if params and parses_params_by_class(engine_cls):
            defaults = read_model_defaults(resolved.path, engine_cls.params_class)
            parse_attrs(engine_cls.params_class, {**defaults, **params}, "params")

    def __call__(self, slot: int = 0) -> Engine:
        import mizuoto
        from mizuoto.options import Options

        options = Options.from_mapping(self.options)
        overrides = []
        if self.workers > 1:
            import torch

            device = options.compute.device
            if device in ("auto", "cuda") and torch.cuda.is_available():
                overrides.append(f"compute.device=cuda:{slot % torch.cuda.device_count()}")
            elif options.compute.cpu_threads is None:
                threads = max(1, (os.cpu_count() or 1) // self.workers)
                overrides.append(f"compute.cpu_threads={threads}")
        if overrides:
            options = options.with_overrides(overrides)
        return mizuoto.load(self.model, engine=self.engine, options=options)


def _plain_options(options: Options | dict | None) -> dict[str, Any]:
    if options is None or isinstance(options, dict):
        return dict(options or {})
    return {"compute": attrs.asdict(options.compute),
            "engines": {name: dict(section) for name, section in options.engines.items()}}
