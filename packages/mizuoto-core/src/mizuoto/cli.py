"""The ``mizuoto`` command.

Exit codes: 0 success; 1 unexpected error; 2 bad request, option or usage (also ``serve`` on a
port already in use); 3 engine, model or file not found (or a checkpoint that does not match);
4 capability not supported; 5 a batch finished with failed lines (its manifest names them); 130
interrupted (SIGINT; also a training run stopped by Ctrl-C, its checkpoint saved); 143 a
training run stopped by SIGTERM.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from mizuoto.audio_formats import FORMATS, extensions_text
from mizuoto.batch.run import MAX_WORKERS
from mizuoto.benchmarking.command import bench, bench_run
from mizuoto.command_options import command_options as _options
from mizuoto.command_options import command_params as _params
from mizuoto.command_options import options_to_load as _options_to_load
from mizuoto.errors import InvalidRequest, MizuotoError

log = logging.getLogger("mizuoto")


class _Group(click.Group):
    """Turns Mizuoto errors into one-line messages and exit codes (tracebacks with --debug),
    and adds the commands plugins register (``register_commands``) when commands are looked up.
    """

    _plugin_commands_added = False

    def _add_plugin_commands(self) -> None:
        if self._plugin_commands_added:
            return
        self._plugin_commands_added = True
        from mizuoto.plugins import load_plugins, pm

        load_plugins()
        builtin = dict(self.commands)
        pm.hook.register_commands(cli=self)
        for name, command in builtin.items():  # a plugin may add commands, not replace ours
            if self.commands[name] is not command:
                log.warning("a plugin's command %r is ignored: mizuoto has its own", name)
                self.commands[name] = command

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None:
            self._add_plugin_commands()
            command = super().get_command(ctx, name)
        return command

    def invoke(self, ctx):
        if not (ctx.obj and ctx.obj.get("debug")):
            _name_thread_disk_failures()
        try:
            return super().invoke(ctx)
        except MizuotoError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)
        except OSError as exc:
            # what only the write itself can tell (a full disk, a device that refuses):
            # one line naming the file, not a traceback
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"Error: {exc.strerror or exc}{where}", err=True)
            ctx.exit(1)


def _name_thread_disk_failures() -> None:
    """A full or failing disk met by a writer thread (TensorBoard's event writer, a trainer's
    checkpoint saver) is one named line on stderr, as on the main thread: no traceback."""
    import threading

    from mizuoto.runtime.atomic import storage_error

    previous = threading.excepthook
    if getattr(previous, "names_disk_failures", False):
        return

    def hook(args):
        where = getattr(args.exc_value, "filename", None) or f"(thread {args.thread.name})"
        named = storage_error(args.exc_value, where) if args.exc_value else None
        if named is None:
            return previous(args)
        click.echo(f"Error: {named}", err=True)

    hook.names_disk_failures = True
    threading.excepthook = hook


@click.group(cls=_Group)
@click.version_option(package_name="mizuoto-core")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or info messages.")
@click.pass_context
def cli(ctx, debug, quiet):
    """Mizuoto: neural text-to-speech with pluggable engines."""
    ctx.ensure_object(dict)
    ctx.obj.update(debug=debug, quiet=quiet)
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


#: What each hook gives a user, as `mizuoto plugins` lists it.
_PLUGIN_FEATURES = {
    "register_engines": "engines",
    "register_trainers": "training (mizuoto train)",
    "register_models": "catalog models (mizuoto models)",
    "register_contract_fixtures": "random-init models (mizuoto random-model)",
    "register_upstream_baselines": "upstream speed baselines (mizuoto bench)",
    "register_commands": "commands",
}


@cli.command()
def plugins():
    """List installed plugins, their versions and what they provide."""
    from mizuoto.plugins import get_plugins
    from mizuoto.registry import engine_refs

    found = get_plugins()
    if not found:
        click.echo("No plugins installed: no engine is available. "
                   "Install one, e.g. pip install mizuoto-f5tts")
        return
    for plugin in found:
        version = plugin["version"] or "?"
        dist = plugin["distribution"] or plugin["name"]
        click.echo(f"{plugin['name']}  ({dist} {version})")
        features = [_PLUGIN_FEATURES.get(hook, hook) for hook in plugin["hooks"]]
        click.echo(f"  provides: {', '.join(features) or '-'}")
        for error in plugin.get("errors", []):
            click.echo(f"  error: {error}")
    refs = engine_refs()  # the engines are not imported: listing them stays fast
    if not refs:
        click.echo("No engines registered.")
        return
    click.echo(f"engines: {', '.join(sorted(refs))}")
    for name, ref in sorted(refs.items()):
        if ref.capabilities:
            capabilities = ", ".join(sorted(c.value for c in ref.capabilities))
            click.echo(f"  {name}: {capabilities}")


@cli.command()
def models():
    """List catalog models and which are already downloaded."""
    from mizuoto.catalog import downloaded_files
    from mizuoto.registry import catalog

    entries = catalog()
    if not entries:
        click.echo("No catalog entries: no engine is installed.")
        return
    for model_id, entry in sorted(entries.items()):
        files = downloaded_files(entry)
        have = sum(1 for found in files.values() if found is not None)
        needed = len(files)
        if not needed:
            state = "no files"  # nothing to download: the engine needs no weights
        else:
            state = "downloaded" if have == needed else f"{have}/{needed} files"
        license_note = entry.license + (" (non-commercial)" if entry.non_commercial else "")
        click.echo(f"{model_id:<20} {state:<12} {license_note:<28} {entry.description}")


class _ProgressBars:
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


class _ProgressLog:
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
def _progress(quiet: bool) -> Iterator:
    """The progress callback for a command: bars on a terminal, log lines elsewhere, nothing
    with --quiet. Bars are cleared when the block ends (also on an error), so the result or
    the error message starts on a clean line; log records print above the bars meanwhile."""
    if quiet:
        yield None
        return
    stderr = sys.stderr
    if not stderr.isatty():
        yield _ProgressLog()
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    bars = _ProgressBars(stderr)
    try:
        with logging_redirect_tqdm():
            yield bars
    finally:
        bars.close()


def _read_text(text, text_file):
    if text_file is not None:
        from mizuoto.text.files import read_utf8

        return read_utf8(text_file, "--text-file")
    if text is None:
        raise InvalidRequest("TEXT", "is missing", "give the text or --text-file")
    return text


def _first_section(text_file):
    """The start of a long text, to check the request before the model loads."""
    from mizuoto.longform import iter_sections
    from mizuoto.text.files import check_utf8

    check_utf8(text_file, "--text-file")  # the whole file, before any model loads
    with open(text_file, encoding="utf-8-sig") as handle:
        first = next(iter_sections([handle.read(1 << 16)], 1 << 16), None)
    if first is None:
        raise InvalidRequest("--text-file", "is empty", "give the words to speak")
    return first


_model_options = [
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


def _with_model_options(function):
    for option in reversed(_model_options):
        function = option(function)
    return function


@cli.command(name="say")
@click.argument("text", required=False)
@click.option("-f", "--text-file", type=click.Path(exists=True, dir_okay=False), help="Read the text from a file.")
@_with_model_options
@click.option("--ref-audio", type=click.Path(dir_okay=False), help="Reference recording of the voice to clone.")
@click.option("--ref-text", help="Transcript of the reference recording.")
@click.option("--voice", "voice_file", type=click.Path(dir_okay=False), help="A saved voice file (from --save-voice).")
@click.option("--save-voice", type=click.Path(dir_okay=False), help="Build a voice from the reference and save it here.")
@click.option("--instruction", help="Describe the voice or style (engines that support design).")
@click.option("--stream", is_flag=True, help="Stream: write audio to the file as it is generated.")
@click.option("--resume", is_flag=True, help="Continue an interrupted --text-file run (OUTPUT.part/).")
@click.option("--section-chars", type=click.IntRange(1), default=None, help="Long-form section size in characters (default 1000).")
@click.option("--lora", type=click.Path(exists=True), help="A LoRA directory to apply (engines with set_lora, e.g. VoxCPM).")
@click.pass_context
def say(ctx, text, text_file, model, engine, output, seed, steps, guidance, params, option_pairs,
        options_file, ref_audio, ref_text, voice_file, save_voice, instruction, stream, resume,
        section_chars, lora):
    """Speak TEXT (or --text-file) and write it to --output.

    A --text-file of any length is spoken section by section straight to the file (bounded
    memory; --resume continues after an interruption): see docs/longform.md.
    """
    import attrs

    import mizuoto
    from mizuoto.contracts import Capability, Reference, SynthesisRequest, Voice

    quiet = ctx.obj["quiet"]
    if ref_text and not ref_audio:
        raise InvalidRequest("--ref-text", "needs --ref-audio")
    if save_voice and not ref_audio:
        raise InvalidRequest("--save-voice", "needs --ref-audio")
    long_form = (text_file is not None or resume or section_chars is not None) and not stream
    if long_form and text_file is None:
        raise InvalidRequest("--resume" if resume else "--section-chars", "needs --text-file")
    _check_audio_output(output, keeps_files_beside=long_form)
    from mizuoto.output_paths import check_distinct, check_output_file

    if save_voice:
        check_output_file(save_voice, "--save-voice")
    inputs = (("--ref-audio", ref_audio), ("--voice", voice_file), ("--text-file", text_file))
    check_distinct(("--output", output), ("--save-voice", save_voice), *inputs)
    check_distinct(("--save-voice", save_voice), *inputs)
    # Validate the request before loading the model: a bad request fails in milliseconds.
    text_flag = {"text": "--text-file"} if text_file else {}
    with _cli_names(**text_flag):
        request = SynthesisRequest(
            text=_first_section(text_file) if long_form else _read_text(text, text_file),
            reference=Reference(ref_audio, ref_text) if ref_audio else None,
            voice=Voice.load(voice_file) if voice_file else None,
            instruction=instruction, seed=seed, steps=steps, guidance=guidance,
            params=_params(params),
        )
    options = _options_to_load(options_file, option_pairs)
    with _progress(quiet) as progress, _cli_names(**text_flag):
        tts = mizuoto.load(model, engine=engine, options=options, progress=progress,
                           request=request)
        if lora:
            if not hasattr(tts, "set_lora"):
                raise InvalidRequest("--lora", f"engine {tts.name!r} does not apply LoRAs")
            tts.set_lora(lora)
        if save_voice:
            voice = tts.build_voice(request.reference)
            voice.save(save_voice)
            request = attrs.evolve(request, reference=None, voice=voice)
            log.info("saved voice to %s", save_voice)
        if long_form:
            from mizuoto.longform import DEFAULT_SECTION_CHARS, synthesize_to

            done = synthesize_to(tts, output, request, text_file=text_file, resume=resume,
                                 max_chars=section_chars or DEFAULT_SECTION_CHARS,
                                 progress=progress, resume_hint="--resume")
            applied = done.applied
            if not done.complete:
                raise MizuotoError(f"{output} was not written: {done.sections_done} of "
                                   f"{done.sections} sections are done; rerun with --resume")
            if not quiet:
                click.echo(f"{done.sections} sections ({done.resumed_at} resumed), "
                           f"{done.seconds:.1f} s of audio", err=True)
        elif stream:
            tts.require(Capability.STREAM)
            applied = _stream_to_file(tts, request, output, progress)
        else:
            result = tts.synthesize(request, progress=progress)
            result.save(output)
            applied = result.applied
    _check_written(output)
    _report(applied, output, quiet)


#: The CLI flag of each request field, for the errors engines raise naming the field.
_FLAGS = {"text": "TEXT", "reference": "--ref-audio", "reference.audio": "--ref-audio",
          "reference.text": "--ref-text", "voice": "--voice", "instruction": "--instruction",
          "seed": "--seed", "steps": "--steps", "guidance": "--guidance",
          "segments": "--segment"}


@contextlib.contextmanager
def _cli_names(**flags: str) -> Iterator[None]:
    """Re-raise an :class:`InvalidRequest` naming a request field with the flag that sets it
    (``reference.text`` -> ``--ref-text``, ``params.nfe`` -> ``--param nfe``); ``flags``
    overrides :data:`_FLAGS` (``text="--text-file"``)."""
    try:
        yield
    except InvalidRequest as exc:
        flag = flags.get(exc.field, _FLAGS.get(exc.field))
        if flag is None and exc.field.startswith("params."):
            flag = f"--param {exc.field.removeprefix('params.')}"
        if flag is None:
            raise
        try:
            renamed = type(exc)(flag, exc.problem, exc.fix)
        except TypeError:  # a subclass with another signature
            renamed = InvalidRequest(flag, exc.problem, exc.fix)
        raise renamed from None


def _check_audio_output(output, *, keeps_files_beside: bool = False) -> None:
    """Refuse an output that cannot be written before any model loads: an extension no writer
    knows (the message lists them all), a folder that is read-only or missing under a file, a
    device or FIFO for an output that keeps files beside it (long-form's ``OUT.part/``)."""
    from mizuoto.audio_formats import format_for_path
    from mizuoto.output_paths import check_output_file

    format_for_path(output, "--output")
    check_output_file(output, "--output", special_ok=not keeps_files_beside)


def _check_written(output) -> None:
    """Success is reported only for an output that is there: a file with audio in it (or the
    device or FIFO it was written into)."""
    from mizuoto.runtime.atomic import is_special

    path = Path(output)
    if is_special(path):
        return
    if not path.is_file() or path.stat().st_size == 0:
        raise MizuotoError(f"{output} was not written (no file, or an empty one)")


def _stream_to_file(tts, request, output, progress):
    """Write a stream as it comes: WAV and FLAC chunk by chunk (libsndfile); the other formats
    once the stream has ended, as ``result.save`` writes them."""
    import soundfile as sf

    from mizuoto.audio_formats import format_for_path
    from mizuoto.runtime.atomic import atomic_path

    fmt = format_for_path(output, "--output")
    if not fmt.metadata:
        import torch

        from mizuoto.contracts import Audio
        from mizuoto.contracts.results import file_metadata

        chunks = []
        for chunk in tts.stream(request, progress=progress):
            chunks.append(chunk)
            _streamed(progress, len(chunks), sum(c.audio.duration for c in chunks), "so far")
        audio = Audio(torch.cat([c.audio.samples for c in chunks]), tts.info.sample_rate)
        audio.save(output, metadata=file_metadata(chunks[-1].applied))
        return chunks[-1].applied
    applied = None
    with atomic_path(output) as tmp:
        with sf.SoundFile(tmp, "w", samplerate=tts.info.sample_rate, channels=1,
                          format=fmt.soundfile[0], subtype=fmt.soundfile[1]) as f:
            written = 0.0
            for index, chunk in enumerate(tts.stream(request, progress=progress)):
                f.write(chunk.audio.numpy())
                f.flush()
                written += chunk.audio.duration
                _streamed(progress, index + 1, written, "written")
                if chunk.is_last:
                    applied = chunk.applied
    return applied


#: The progress stage of `say --stream`: one per chunk that reached the output.
STREAMED = "streamed"


def _streamed(progress, chunks: int, seconds: float, state: str) -> None:
    if progress is not None:
        from mizuoto.contracts.progress import report

        report(progress, STREAMED, chunks, None, f"{seconds:.2f} s of audio {state}")


def _report(applied, output, quiet):
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


def _hidden_alias(command: click.Command) -> click.Command:
    alias = copy.copy(command)
    alias.hidden = True
    return alias


def _compute_report(compute) -> str:
    """The compute settings in effect that differ from the defaults (the thread count always):
    ``  cpu_threads=2  cpu_allocator=jemalloc``."""
    from mizuoto.options import ComputeOptions

    defaults = ComputeOptions()
    return "".join(f"  {key}={value}" for key, value in compute.items()
                   if getattr(defaults, key, None) != value)


# `synth` is an older name of `say`: it still works, and --help lists `say` only
cli.add_command(_hidden_alias(say), name="synth")


@cli.command()
@click.argument("text")
@_with_model_options
@click.option("--ref-audio", required=True, type=click.Path(dir_okay=False), help="The recording to edit.")
@click.option("--ref-text", required=True, help="Its transcript.")
@click.option("--segment", "segments", multiple=True, required=True, metavar="START:END", help="Span in seconds to regenerate (repeatable).")
@click.pass_context
def edit(ctx, text, model, engine, output, seed, steps, guidance, params, option_pairs,
         options_file, ref_audio, ref_text, segments):
    """Replace spans of a recording so that it says TEXT."""
    import mizuoto
    from mizuoto.contracts import Capability, EditRequest, Reference

    _check_audio_output(output)
    from mizuoto.output_paths import check_distinct

    # an in-place edit would replace the only copy of the recording with a random-seed take
    check_distinct(("--output", output), ("--ref-audio", ref_audio))
    spans = []
    for segment in segments:
        try:
            start, end = (float(x) for x in segment.split(":"))
        except ValueError:
            raise InvalidRequest("--segment", f"{segment!r} must be START:END in seconds") from None
        spans.append((start, end))
    options = _options_to_load(options_file, option_pairs)
    with _progress(ctx.obj["quiet"]) as progress, _cli_names():
        tts = mizuoto.load(model, engine=engine, options=options, progress=progress)
        tts.require(Capability.EDIT)
        result = tts.edit(EditRequest(Reference(ref_audio, ref_text), text, spans, seed=seed,
                                      steps=steps, guidance=guidance, params=_params(params)),
                          progress=progress)
        result.save(output)
    _check_written(output)
    _report(result.applied, output, ctx.obj["quiet"])


class _FixtureListCommand(click.Command):
    """Lists the installed random-init models (contract fixtures) at the end of its
    ``--help``."""

    def format_epilog(self, ctx, formatter):
        from mizuoto.registry import random_models

        fixtures = random_models()
        with formatter.section("Random-init models"):
            if not fixtures:
                formatter.write_text("none: no engine is installed (pip install mizuoto-f5tts)")
            formatter.write_dl([(fid, fixture.description or "")
                                for fid, fixture in sorted(fixtures.items())])


@cli.command()
@click.argument("input_file", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.option("-m", "--model", required=True, help="Catalog id or model directory (loaded once).")
@click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory).")
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder for <id>.<format> files and manifest.jsonl.")
@click.option("--format", "file_format", type=click.Choice(list(FORMATS)), default="wav", show_default=True, help="Audio format of the files written.")
@click.option("--steps", type=int, help="Sampler steps for lines that do not set them.")
@click.option("--guidance", type=float, help="Guidance for lines that do not set it.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Engine setting for every line (a line's params win).")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option such as compute.device=cpu (repeatable).")
@click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1, show_default=True, help="Local worker processes (CPU cores shared; one GPU each).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]", help="Run on Ray (mizuoto-core[ray]): a local instance, or ADDRESS.")
@click.option("--ray-actors", type=click.IntRange(1, MAX_WORKERS), default=2, show_default=True, help="Ray actors (model copies).")
@click.option("--ray-cpus", type=float, default=0.5, show_default=True, help="CPUs per Ray actor (above 0).")
@click.option("--ray-gpus", type=float, default=0.0, show_default=True, help="GPUs per Ray actor (0 or more).")
@click.pass_context
def batch(ctx, input_file, model, engine, output_dir, file_format, steps, guidance, params,
          option_pairs, options_file, workers, ray_address, ray_actors, ray_cpus, ray_gpus):
    """Speak every line of INPUT (JSONL, CSV, TSV or plain text) into --output-dir.

    Each line gives id, text and optionally voice, reference, reference_text, instruction, seed,
    steps, guidance, params. A bad line is recorded in manifest.jsonl with its error and the
    batch goes on; lines already written with the same request are skipped, so a rerun
    resumes. Exit code 5 when any line failed. See docs/batch.md.
    """
    from mizuoto.batch.items import count_lines
    from mizuoto.batch.run import BatchJob, ModelLoader, run_batch
    from mizuoto.output_paths import check_output_dir

    # everything that can be checked is, before any model loads or worker starts
    check_output_dir(output_dir, "--output-dir")
    defaults = {"steps": steps, "guidance": guidance, "params": _params(params)}
    job = BatchJob(input_file, output_dir, file_format,
                   {key: value for key, value in defaults.items() if value not in (None, {})})
    count_lines(job.input)  # an input unreadable as a whole (encoding, quoting, header)
    settings = None
    if ray_address:
        from mizuoto.batch.ray import RaySettings

        settings = RaySettings(None if ray_address == "local" else ray_address, ray_actors,
                               ray_cpus, ray_gpus)
    options = _options_to_load(options_file, option_pairs)
    actors = ray_actors if ray_address else workers
    if options.compute.cpu_pinning and (actors > 1 or ray_address):
        from mizuoto.errors import InvalidOption

        # each worker would bind its threads to the same first cores of the machine
        raise InvalidOption("compute.cpu_pinning", "binds a process's threads to the first "
                            "cores: several batch workers would all share them; leave it off "
                            "with --workers or --ray")
    loader = ModelLoader(model, engine, options, workers=actors)
    # the model is there, an engine loads it, --param suits it: exit 3 or 2 now, not per line
    loader.check(defaults["params"])
    records = None
    if settings is not None:
        from mizuoto.batch.ray import ray_records

        records = ray_records(loader, settings)
    with _progress(ctx.obj["quiet"]) as progress:
        summary = run_batch(job, load=loader, workers=workers, progress=progress,
                            records=records)
    click.echo(f"{summary.lines} lines: {summary.ok} written, {summary.skipped} already done, "
               f"{summary.failed} failed; manifest {summary.manifest}", err=True)
    if summary.failed:
        ctx.exit(5)


@cli.command(name="random-model", cls=_FixtureListCommand)
@click.argument("fixture")
@click.argument("directory", type=click.Path(file_okay=False))
def random_model(fixture, directory):
    """Write the random-init model FIXTURE (e.g. f5tts/tiny-v1-base) to DIRECTORY.

    Most of these models have random weights: such a model speaks noise, not speech. They exist
    so that plugin authors, tests and offline demos can run the whole synthesis path without
    any download. The installed ones are listed below. DIRECTORY must be new, empty or an
    earlier write of the same fixture (a directory holding other files is refused).
    """
    from mizuoto.registry import random_models

    fixtures = random_models()
    if not fixtures:
        raise InvalidRequest("FIXTURE", f"{fixture!r}: no engine is installed, so there are no "
                             "random-init models", "pip install mizuoto-f5tts (or "
                             "mizuoto-voxcpm), then see mizuoto random-model --help")
    if fixture not in fixtures:
        known = ", ".join(sorted(fixtures))
        raise InvalidRequest("FIXTURE", f"unknown random-init model {fixture!r}",
                             f"known: {known}")
    from mizuoto.output_paths import check_output_dir

    if not directory.strip():  # "" would be the current directory
        raise InvalidRequest("DIRECTORY", "is empty", "name the directory to write the model in")
    path = check_output_dir(directory, "DIRECTORY")
    path.mkdir(parents=True, exist_ok=True)
    _write_fixture(fixtures[fixture], path)
    note = " (random weights: noise, not speech)" if fixtures[fixture].random_init else ""
    click.echo(f"Wrote {fixture} to {path}{note}", err=True)


def _write_fixture(fixture, path: Path) -> None:
    """Write ``fixture`` beside ``path``, then move its files in: a directory holding anything
    but the files this model writes (a rerun) is refused, never mixed with a model's files (two
    checkpoints, or files another engine recognizes, in one model directory)."""
    import shutil
    import tempfile

    staging = Path(tempfile.mkdtemp(prefix=".random-model-", dir=path.parent))
    try:
        fixture.make(staging)
        if fixture.random_init:
            from mizuoto.contracts.fixtures import mark_random_init

            mark_random_init(staging, fixture.id)
        extra = sorted(item.name for item in path.iterdir() if not (staging / item.name).exists())
        if extra:
            raise InvalidRequest("DIRECTORY", f"{path} holds files this model does not write "
                                 f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''})",
                                 "name a new or empty directory")
        for item in staging.iterdir():
            target = path / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _training_settings(command):
    """The ``train`` options of `TrainingConfig`'s settings (`training_settings`: each declared
    once there, with its default and check; None here: the recipe's value applies)."""
    from mizuoto.contracts.trainer import training_settings

    for setting in reversed(training_settings()):
        kind = click.Choice(setting.kind) if isinstance(setting.kind, tuple) else setting.kind
        command = click.option(setting.flag, setting.name, type=kind, default=None,
                               help=setting.help)(command)
    return command


_DATA_HELP = ("The data set: a metadata.csv (upstream F5-TTS's layout: header audio_file|text, "
              "one clip per line, paths relative to the file), a JSONL manifest (one "
              '{"audio": PATH, "text": ...} object per line), or a folder holding one; a folder '
              "may hold a train manifest and a validation one (train*.jsonl, val*.jsonl).")


@cli.command()
@click.option("-e", "--engine", required=True, help="Engine whose trainer runs (f5tts, voxcpm, ...).")
@click.option("--method", default=None, help="full or lora (default: the --config file's, else full).")
@click.option("-m", "--model", help="Model to fine-tune: a catalog id or a model directory (default: the --config file's).")
@click.option("--data", "dataset", type=click.Path(exists=True), help=_DATA_HELP)
@click.option("--output", "output_dir", required=True, type=click.Path(file_okay=False), help="Run directory: checkpoints, metrics, recipe.json, export/ (a run there resumes).")
@_training_settings
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="compute.* option such as compute.device=cuda:1 (repeatable).")
@click.option("--param", "param_pairs", multiple=True, metavar="KEY=VALUE", help="A recipe setting (repeatable), e.g. grad_accum_steps=4 or lora_r=16; values are TOML (true, 1e-4, [\"a\", \"b\"]). Unknown keys are refused by name.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), help="Recipe file: TOML of the same keys, or upstream's own (VoxCPM conf/*.yaml; F5-TTS finetune_cli flag names).")
@click.pass_context
def train(ctx, engine, method, model, dataset, output_dir, option_pairs, param_pairs, config_file,
          **settings):
    """Fine-tune a model with the engine's trainer (prepare, train, export).

    The recipe starts from upstream's defaults for the engine, method and model; a --config
    file, then --param pairs, then the options above override them. The effective recipe is
    printed at the start and stored as recipe.json in the run directory.
    """
    from mizuoto.registry import get_trainer
    from mizuoto.training.recipe import recipe_text, training_config

    trainer = get_trainer(engine)()
    explicit = {**settings,
                "compute": _options(None, option_pairs).compute if option_pairs else None}
    config = training_config(trainer, method=method, model=model, dataset=dataset,
                             output_dir=output_dir, config_file=config_file,
                             param_pairs=param_pairs, explicit=explicit)
    trainer.check(config)
    with _progress(ctx.obj["quiet"]) as progress:
        run = trainer.prepare(config, progress=progress)
        recipe = Path(output_dir) / "recipe.json"
        if recipe.is_file() and os.environ.get("RANK", "0") == "0":
            click.echo(f"Recipe ({recipe}):\n{recipe_text(json.loads(recipe.read_text()))}",
                       err=True)
        result = trainer.train(run, progress=progress)
        if result.interrupted is None:
            exported = trainer.export(run, Path(output_dir) / "export")
    if result.interrupted is not None:
        _stopped_training(ctx, result, _resume_command(ctx.params))
    click.echo(f"{_trained(result)}; exported {exported}", err=True)


def _trained(result) -> str:
    """What this run trained: all its steps, the ones after a resumed checkpoint, or none
    (a rerun of a finished run only exports again)."""
    start = result.resumed_from or 0
    if result.steps_done <= start:
        return (f"Nothing to train: the run in {result.output_dir} already finished its "
                f"{result.steps_done} steps")
    if start:
        return (f"Trained steps {start + 1} to {result.steps_done} (resumed after step "
                f"{start})")
    return f"Trained {result.steps_done} steps"


def _resume_command(params: dict) -> str:
    """The ``mizuoto train`` command line that continues a run (the same options, as given);
    under torchrun, with as many processes."""
    import shlex

    from mizuoto.contracts.trainer import training_settings

    words = ["mizuoto", "train"]
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1:
        words = ["torchrun", "--nproc_per_node", str(processes), "-m", *words]
    for option, key in (("-e", "engine"), ("--method", "method"), ("-m", "model"),
                        ("--data", "dataset"), ("--output", "output_dir"),
                        *((s.flag, s.name) for s in training_settings()),
                        ("--config", "config_file")):
        if params.get(key) is not None:
            words += [option, str(params[key])]
    for flag, key in (("--option", "option_pairs"), ("--param", "param_pairs")):
        for pair in params.get(key) or ():
            words += [flag, pair]
    return shlex.join(words)


def _stopped_training(ctx, result, command: str) -> None:
    """Say where a run stopped by a signal stands and how to resume it; exit as a process
    ended by that signal (130 SIGINT, 143 SIGTERM). Under torchrun, process 0 says it."""
    from mizuoto.runtime.interruption import exit_status

    if os.environ.get("RANK", "0") == "0":
        click.echo(f"Stopped by {result.interrupted} after step {result.steps_done}; the "
                   f"checkpoint is saved in {result.output_dir} (not exported). To resume:\n"
                   f"  {command}", err=True)
    ctx.exit(exit_status(result.interrupted))


@cli.command()
@click.option("-m", "--model", "models", multiple=True, help="Catalog id or model directory (repeatable); a directory is named by its directory name.")
@click.option("--alias", "aliases", multiple=True, metavar="NAME=MODEL", help="Serve MODEL under NAME (repeatable), e.g. tts-1=/path/to/model.")
@click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on, 1 to 65535 (in use: exit 2).")
@click.option("--api-key", envvar="MIZUOTO_API_KEY", help="Require Authorization: Bearer KEY on every path but /health (env MIZUOTO_API_KEY; an empty key is refused).")
@click.option("--queue-size", default=16, show_default=True, type=int, help="Requests waiting per model before 429.")
@click.option("--grace", default=30.0, show_default=True, type=float, help="Seconds in-flight requests get to finish on shutdown (0 to 3600).")
@click.option("--max-loaded", type=int, help="Models kept loaded at once (least recently used unloaded; default: all).")
@click.option("--memory-budget", metavar="SIZE", help="Weights kept loaded at most, e.g. 8G or 500M (least recently used unloaded).")
@click.option("--max-batch", default=1, show_default=True, type=int, help="Requests of one model run at once, 1 to 256; an engine that batches (VoxCPM streams) steps them together. Batched audio is close to, not always bit-identical with, unbatched (docs/performance.md).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", help="Also answer requests whose Host is NAME (repeatable; a reverse proxy's public name; '*': any). Loopback names and --host are always answered.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="ORIGIN", help="Also take state-changing requests from web pages at ORIGIN, e.g. https://app.example.com (repeatable; the server's own page always may).")
@click.option("--max-voices", default=100, show_default=True, type=int, help="Voices stored at most (more: 409).")
@click.option("--max-voices-size", default="512M", show_default=True, metavar="SIZE", help="Bytes of stored voices at most, e.g. 512M or 2G (more: 409).")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option such as compute.device=cpu (repeatable).")
@click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]", help="Serve on Ray Serve (mizuoto-core[ray]): a local instance, or the cluster at ADDRESS (docs/serve.md, Scaling out).")
@click.option("--replicas", type=int, default=1, show_default=True, help="With --ray: replicas per model.")
@click.option("--min-replicas", type=int, help="With --ray: autoscale each model from this many replicas (with --max-replicas).")
@click.option("--max-replicas", type=int, help="With --ray: autoscale each model up to this many replicas.")
@click.option("--target-ongoing", type=float, default=1.0, show_default=True, help="With --ray and autoscaling: requests per replica to aim at.")
@click.option("--num-cpus", type=float, default=1.0, show_default=True, help="With --ray: CPUs each model replica reserves (fractions allowed).")
@click.option("--num-gpus", type=float, default=0.0, show_default=True, help="With --ray: GPUs each model replica reserves (fractions allowed).")
@click.option("--ingress-replicas", type=int, default=1, show_default=True, help="With --ray: HTTP ingress replicas (more than one on several nodes: share the voices directory).")
@click.option("--lora-dir", "lora_dirs", multiple=True, type=click.Path(exists=True, file_okay=False), help="With --ray: a directory of VoxCPM LoRA exports, each served as a model named by its subdirectory (repeatable).")
@click.option("--max-adapters", type=int, default=4, show_default=True, help="With --ray: LoRA exports loaded at once per replica (least recently used unloaded).")
@click.pass_context
def serve(ctx, models, aliases, engine, host, port, api_key, queue_size, grace, max_loaded,
          memory_budget, max_batch, allowed_hosts, allowed_origins, max_voices, max_voices_size,
          option_pairs, options_file, ray_address=None, replicas=1, min_replicas=None,
          max_replicas=None, target_ongoing=1.0, num_cpus=1.0, num_gpus=0.0,
          ingress_replicas=1, lora_dirs=(), max_adapters=4):
    """Serve models over an OpenAI-compatible speech API (docs/serve.md)."""
    try:
        from mizuoto.serve.app import ServeConfig, model_names, run
        from mizuoto.serve.page import page_url
    except ImportError as exc:
        raise click.ClickException(f"mizuoto serve needs the serve extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[serve]\"") from None
    from_env = ctx.get_parameter_source("api_key") is click.core.ParameterSource.ENVIRONMENT
    if api_key is None and "MIZUOTO_API_KEY" in os.environ:
        # click reads an empty variable as unset: here it must not mean "no authentication"
        api_key, from_env = os.environ["MIZUOTO_API_KEY"], True
    names, budget = model_names(models, aliases), _size(memory_budget)
    voices_bytes = _size(max_voices_size, "--max-voices-size")
    options = _options_to_load(options_file, option_pairs)
    try:
        config = ServeConfig(models=names, engine=engine, host=host, port=port,
                             api_key=api_key, queue_size=queue_size, grace=grace,
                             max_loaded=max_loaded, memory_budget=budget, options=options,
                             max_batch=max_batch, allowed_hosts=allowed_hosts,
                             allowed_origins=allowed_origins, max_voices=max_voices,
                             max_voices_bytes=voices_bytes)
    except InvalidRequest as exc:  # named as the user wrote it
        option = "MIZUOTO_API_KEY" if exc.field == "api_key" and from_env else \
            "--" + {"max_voices_bytes": "max_voices_size"}.get(exc.field, exc.field).replace(
                "_", "-")
        raise InvalidRequest(option, exc.problem, exc.fix) from None
    ray_settings = None
    if ray_address:
        ray_settings = _ray_settings(ray_address, replicas=replicas, min_replicas=min_replicas,
                                     max_replicas=max_replicas, target_ongoing=target_ongoing,
                                     num_cpus=num_cpus, num_gpus=num_gpus,
                                     ingress_replicas=ingress_replicas, lora_dirs=lora_dirs,
                                     max_adapters=max_adapters)
    click.echo(f"Listen in a browser: {page_url(host, port)} (the API is under /v1)")
    if ray_settings is not None:
        from mizuoto.serve.ray import run as run_on_ray

        run_on_ray(config, ray_settings)
        return
    run(config)


def _ray_settings(address: str, **settings):
    """``mizuoto serve --ray``'s settings, a bad one named by its flag."""
    try:
        import ray.serve  # noqa: F401

        from mizuoto.serve.ray import RaySettings
    except ImportError as exc:
        raise click.ClickException(f"mizuoto serve --ray needs the ray extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[ray]\"") from None
    try:
        return RaySettings(None if address == "local" else address, **settings)
    except InvalidRequest as exc:
        raise InvalidRequest("--" + exc.field.replace("_", "-"), exc.problem, exc.fix) from None


@cli.command()
@click.option("-m", "--model", "models", multiple=True, help="Catalog id or model directory (repeatable); a directory is named by its directory name.")
@click.option("--alias", "aliases", multiple=True, metavar="NAME=MODEL", help="Serve MODEL under NAME (repeatable).")
@click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default; Wyoming has no authentication).")
@click.option("--port", default=10200, show_default=True, type=int, help="Port to listen on, 1 to 65535 (in use: exit 2).")
@click.option("--queue-size", default=16, show_default=True, type=int, help="Syntheses waiting per model before an error.")
@click.option("--max-connections", default=32, show_default=True, type=int, help="Clients connected at once.")
@click.option("--seed", type=int, help="Seed of every synthesis (same text and voice: same audio); default: each draws one.")
@click.option("--steps", type=int, help="Sampling steps of every synthesis (default: the engine's).")
@click.option("--language", "languages", multiple=True, help="Language to announce (repeatable; default: the engine's).")
@click.option("--voices-dir", type=click.Path(file_okay=False), help="Saved voices (default: $MIZUOTO_HOME/voices, as mizuoto serve).")
@click.option("--zeroconf", is_flag=True, help="Announce the server to Home Assistant on the network (needs zeroconf).")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option such as compute.device=cpu (repeatable).")
@click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options.")
def wyoming(models, aliases, engine, host, port, queue_size, max_connections, seed, steps,
            languages, voices_dir, zeroconf, option_pairs, options_file):
    """Serve models to Home Assistant over the Wyoming protocol (docs/home-assistant.md)."""
    import importlib

    try:
        from mizuoto.serve.app import ServeConfig, model_names
        from mizuoto.wyoming.server import WyomingConfig, run

        importlib.import_module("wyoming.server")
    except ImportError as exc:
        raise click.ClickException(f"mizuoto wyoming needs the wyoming extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[wyoming]\"") from None
    if zeroconf:
        try:
            importlib.import_module("zeroconf.asyncio")
        except ImportError:
            raise click.ClickException(
                "--zeroconf needs the zeroconf package, which is not installed: pip install "
                "\"mizuoto-core[wyoming]\" (or pip install zeroconf), or leave --zeroconf off "
                "and add the server in Home Assistant by host and port") from None
    names = model_names(models, aliases)
    options = _options_to_load(options_file, option_pairs)
    try:
        config = WyomingConfig(ServeConfig(
            models=names, engine=engine, host=host, port=port, queue_size=queue_size,
            options=options, voices_dir=Path(voices_dir) if voices_dir else None),
            max_connections=max_connections, seed=seed, steps=steps, languages=languages,
            zeroconf=zeroconf)
    except InvalidRequest as exc:  # named as the user wrote it
        raise InvalidRequest("--" + exc.field.replace("_", "-"), exc.problem, exc.fix) \
            from None
    run(config)


def _size(text, option="--memory-budget"):
    """Bytes from ``8G``, ``500M``, ``64K`` or a plain number; None stays None."""
    if text is None:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().removesuffix("B"), 1
    if number[-1:] in units:
        number, unit = number[:-1], units[number[-1]]
    try:
        value = float(number)
    except ValueError:
        raise InvalidRequest(option, f"{text!r} is not a size", "e.g. 8G or 500M") \
            from None
    if not 0 < value < float("inf"):
        raise InvalidRequest(option, f"{text!r} must be a positive size")
    return int(value * unit)


cli.add_command(bench)
cli.add_command(bench_run)


def main() -> None:
    cli(obj={"may_restart": True})


if __name__ == "__main__":
    main()
