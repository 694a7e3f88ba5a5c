"""The command toolkit: the options, checks and reporting that ``mizuoto``'s commands share,
for a plugin's commands (``register_commands``) as for Mizuoto's own.

A command that loads a model and writes audio takes :func:`model_options`, checks its output
(:func:`check_audio_output`), loads and speaks inside :func:`command_progress` and
:func:`cli_names`, then :func:`check_written` and :func:`report_written`: ``mizuoto edit`` is
one, and docs/plugins.md (``register_commands``) shows a plugin's.

A plugin imports these names from :mod:`mizuoto.plugin`. Nothing here imports torch or the
plugins at import time: ``mizuoto --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from mizuoto.audio_formats import extensions_text
from mizuoto.command_options import command_params, options_to_load
from mizuoto.errors import InvalidRequest, MizuotoError

__all__ = ["FormatChoice", "check_audio_output", "check_written", "cli_names",
           "command_params", "command_progress", "model_options", "options_to_load",
           "report_written", "server_options"]

log = logging.getLogger("mizuoto")

#: The progress stage of `say --stream`: one per chunk that reached the output.
STREAMED = "streamed"

_MODEL_OPTIONS = [
    click.option("-m", "--model", required=True, help="Catalog id (see `mizuoto models`) or a model directory."),
    click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory)."),
    click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help=f"Audio file to write, by extension: {extensions_text()}."),
    click.option("--seed", type=int, help="Seed (default: drawn and printed)."),
    click.option("--steps", type=int, help="Sampler steps (engine default if unset)."),
    click.option("--guidance", type=float, help="Guidance strength (engine default if unset)."),
    click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Engine-specific request setting (repeatable)."),
    click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option such as compute.device=cpu (repeatable)."),
    click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options."),
]


def model_options(function):
    """Add the options of a command that loads a model and writes audio, as ``say`` and
    ``edit`` take them: ``-m/--model``, ``-e/--engine``, ``-o/--output``, ``--seed``,
    ``--steps``, ``--guidance``, ``--param`` (``params``), ``--option`` (``option_pairs``) and
    ``--options-file``."""
    for option in reversed(_MODEL_OPTIONS):
        function = option(function)
    return function


def server_options(*, port: int, unauthenticated: bool = False, queue_full: str = "429"):
    """Add the options every server command takes, as ``serve`` and ``wyoming`` take them:
    ``-m/--model`` (``models``, repeatable), ``--alias`` (``aliases``), ``-e/--engine``,
    ``--host`` (loopback by default), ``--port`` (default ``port``), ``--queue-size``,
    ``--option`` (``option_pairs``) and ``--options-file``. ``unauthenticated`` says in
    ``--host``'s help that the protocol has no authentication; ``queue_full`` is what a
    request past the queue gets."""
    host_help = "Address to bind (loopback by default" + (
        "; the protocol has no authentication)." if unauthenticated else ").")
    options = [
        click.option("-m", "--model", "models", multiple=True, help="Catalog id or model directory (repeatable); a directory is named by its directory name."),
        click.option("--alias", "aliases", multiple=True, metavar="NAME=MODEL", help="Serve MODEL under NAME (repeatable), e.g. tts-1=/path/to/model."),
        click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory)."),
        click.option("--host", default="127.0.0.1", show_default=True, help=host_help),
        click.option("--port", default=port, show_default=True, type=int, help="Port to listen on, 1 to 65535 (in use: exit 2)."),
        click.option("--queue-size", default=16, show_default=True, type=int, help=f"Requests waiting per model before {queue_full}."),
        click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option such as compute.device=cpu (repeatable)."),
        click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options."),
    ]

    def decorate(function):
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


class FormatChoice(click.Choice):
    """``--format``'s choices: the audio format table's names when they are read, not when
    the command was defined (a format added later is offered and taken)."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=False)

    @property
    def choices(self) -> tuple[str, ...]:
        from mizuoto.audio_formats import FORMATS

        return tuple(FORMATS)

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it: the table wins
        pass


# -- progress --------------------------------------------------------------------------------

class ProgressBars:
    """Progress on a terminal: one tqdm bar per stage on stderr, nested in the order the stages
    start (a text chunk, then the sampling steps inside it). A bar closes, clearing its line,
    when its stage is done, when the stage it is nested in moves on, or when a stage of the
    same kind starts ("sampling 2/3" after "sampling 1/3"); :meth:`close` clears the rest."""

    def __init__(self, file) -> None:
        self._file = file
        self._bars: dict = {}

    def __call__(self, progress) -> None:
        from tqdm import tqdm

        stages = list(self._bars)
        if progress.stage in self._bars:
            finished = stages[stages.index(progress.stage) + 1:]
        else:
            kind = progress.stage.split()[:1]
            finished = [stage for stage in stages if stage.split()[:1] == kind]
        for stage in reversed(finished):
            self._bars.pop(stage).close()
        bar = self._bars.get(progress.stage)
        if bar is None:
            # a stage that starts part done (a resumed long-form run) counts its rate from
            # there: tqdm's rate is (n - initial) / elapsed
            bar = tqdm(total=progress.total, desc=progress.stage, leave=False, file=self._file,
                       dynamic_ncols=True, initial=progress.done)
            self._bars[progress.stage] = bar
        if progress.total is not None and bar.total != progress.total:
            bar.total = progress.total
        bar.n = progress.done
        if progress.detail:
            bar.set_postfix_str(progress.detail, refresh=False)
        bar.refresh()
        if progress.total is not None and progress.done >= progress.total:
            self._bars.pop(progress.stage).close()

    def close(self) -> None:
        # innermost first, so that each bar's line is cleared before the one it is nested in
        for stage in reversed(list(self._bars)):
            self._bars.pop(stage).close()


class ProgressLog:
    """Progress where stderr is not a terminal (a pipe, a log file): no bars and no carriage
    returns; one INFO line per finished text chunk, long-form section, batch line and chunk
    streamed to a file, a training run's progress (loss, rate, ETA) at most every 30 s, other
    stages at DEBUG when they finish."""

    #: seconds between two log lines of a training run's progress
    TRAIN_EVERY = 30.0

    def __init__(self) -> None:
        self._train_logged_at: float | None = None

    def __call__(self, progress) -> None:
        if progress.stage == "train":
            self._train(progress)
        elif progress.stage == STREAMED:
            log.info("streamed chunk %d (%s)", progress.done, progress.detail)
        elif progress.stage in ("chunk", "section", "lines"):
            if progress.done > 0:
                log.info("%s %d/%s done%s", progress.stage, progress.done, progress.total or "?",
                         f" ({progress.detail})" if progress.detail else "")
        elif progress.total is not None and progress.done >= progress.total:
            log.debug("%s done (%d)", progress.stage, progress.total)

    def _train(self, progress) -> None:
        """A training run's loss, rate and ETA every TRAIN_EVERY seconds, and its last update."""
        import time

        now = time.monotonic()
        last = progress.total is not None and progress.done >= progress.total
        if last or self._train_logged_at is None \
                or now - self._train_logged_at >= self.TRAIN_EVERY:
            self._train_logged_at = now
            log.info("train %d/%s%s", progress.done, progress.total or "?",
                     f" ({progress.detail})" if progress.detail else "")


@contextlib.contextmanager
def command_progress(quiet: bool) -> Iterator:
    """The progress callback for a command: bars on a terminal, log lines elsewhere, nothing
    with --quiet. Bars are cleared when the block ends (also on an error), so the result or
    the error message starts on a clean line; log records print above the bars meanwhile."""
    if quiet:
        yield None
        return
    stderr = sys.stderr
    if not stderr.isatty():
        yield ProgressLog()
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    bars = ProgressBars(stderr)
    try:
        with logging_redirect_tqdm():
            yield bars
    finally:
        bars.close()


# -- errors named by their flags, outputs checked before and after ---------------------------

#: The CLI flag of each request field, for the errors engines raise naming the field.
FLAGS = {"text": "TEXT", "reference": "--ref-audio", "reference.audio": "--ref-audio",
         "reference.text": "--ref-text", "voice": "--voice", "instruction": "--instruction",
         "seed": "--seed", "steps": "--steps", "guidance": "--guidance",
         "segments": "--segment"}


@contextlib.contextmanager
def cli_names(**flags: str) -> Iterator[None]:
    """Re-raise an :class:`InvalidRequest` naming a request field with the flag that sets it
    (``reference.text`` -> ``--ref-text``, ``params.nfe`` -> ``--param nfe``); ``flags``
    overrides :data:`FLAGS` (``text="--text-file"``)."""
    try:
        yield
    except InvalidRequest as exc:
        flag = flags.get(exc.field, FLAGS.get(exc.field))
        if flag is None and exc.field.startswith("params."):
            flag = f"--param {exc.field.removeprefix('params.')}"
        if flag is None:
            raise
        try:
            renamed = type(exc)(flag, exc.problem, exc.fix)
        except TypeError:  # a subclass with another signature
            renamed = InvalidRequest(flag, exc.problem, exc.fix)
        raise renamed from None


def check_audio_output(output, *, keeps_files_beside: bool = False) -> None:
    """Refuse an output that cannot be written before any model loads: an extension no writer
    knows (the message lists them all), a folder that is read-only or missing under a file, a
    device or FIFO for an output that keeps files beside it (long-form's ``OUT.part/``)."""
    from mizuoto.audio_formats import format_for_path
    from mizuoto.output_paths import check_output_file

    format_for_path(output, "--output")
    check_output_file(output, "--output", special_ok=not keeps_files_beside)


def check_written(output) -> None:
    """Success is reported only for an output that is there: a file with audio in it (or the
    device or FIFO it was written into)."""
    from mizuoto.runtime.atomic import is_special

    path = Path(output)
    if is_special(path):
        return
    if not path.is_file() or path.stat().st_size == 0:
        raise MizuotoError(f"{output} was not written (no file, or an empty one)")


# -- the result ------------------------------------------------------------------------------

def report_written(applied, output, quiet: bool) -> None:
    """Say on stderr what was written with what (``Wrote OUT  seed=...  dtype=...``, unless
    ``quiet``), and always the weights' licence note and the result's warnings."""
    if applied is None:
        return
    if applied.non_commercial:
        click.echo(f"Note: these weights are licensed {applied.license}: non-commercial use only.",
                   err=True)
    for warning in applied.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if not quiet:
        drawn = " (drawn)" if applied.seed_drawn else ""
        click.echo(f"Wrote {output}  seed={applied.seed}{drawn}  dtype={applied.dtype}  "
                   f"device={applied.device}" + (f"  retries={applied.retries}" if applied.retries else "")
                   + (f"  fallbacks={','.join(applied.fallbacks)}" if applied.fallbacks else "")
                   + _compute_report(applied.compute), err=True)
        if applied.model_defaults:
            import json

            taken = ", ".join(f"{key}={json.dumps(value)}"  # as --param takes them
                              for key, value in applied.model_defaults.items())
            click.echo(f"  with the model directory's defaults: {taken} (--param overrides "
                       "them)", err=True)


def _compute_report(compute) -> str:
    """The compute settings in effect that differ from the defaults (the thread count always):
    ``  cpu_threads=2  cpu_allocator=jemalloc``."""
    from mizuoto.options import ComputeOptions

    defaults = ComputeOptions()
    return "".join(f"  {key}={value}" for key, value in compute.items()
                   if getattr(defaults, key, None) != value)
