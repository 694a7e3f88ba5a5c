"""``mizuoto say``: speak a text into an audio file, in one of three ways (whole, streamed to
the file, or a long text section by section), optionally saving the voice it built; and
``synth``, its older name."""

from __future__ import annotations

import copy
import logging

import click

from mizuoto.commands.toolkit import (
    STREAMED,
    check_audio_output,
    check_written,
    cli_names,
    command_params,
    command_progress,
    model_options,
    options_to_load,
    report_written,
)
from mizuoto.errors import InvalidRequest, MizuotoError

log = logging.getLogger("mizuoto")


@click.command(name="say")
@click.argument("text", required=False)
@click.option("-f", "--text-file", type=click.Path(exists=True, dir_okay=False, allow_dash=True), help="Read the text from a file ('-': standard input).")
@model_options
@click.option("--ref-audio", type=click.Path(dir_okay=False), help="Reference recording of the voice to clone.")
@click.option("--ref-text", help="Transcript of the reference recording.")
@click.option("--voice", "voice_file", type=click.Path(dir_okay=False), help="A saved voice file (from --save-voice).")
@click.option("--save-voice", type=click.Path(dir_okay=False), help="Build a voice from the reference and save it here.")
@click.option("--instruction", help="Describe the voice or style (engines that support design).")
@click.option("--stream", is_flag=True, help="Stream: write audio to the file as it is generated.")
@click.option("--resume", is_flag=True, help="Continue an interrupted --text-file run (OUTPUT.part/).")
@click.option("--section-chars", type=click.IntRange(1), default=None, help="Long-form section size in characters (default 1000).")
@click.option("--lora", type=click.Path(exists=True), help="A LoRA directory to apply (engines that support LoRA, e.g. VoxCPM).")
@click.pass_context
def say(ctx, text, text_file, model, engine, output, seed, steps, guidance, params, option_pairs,
        options_file, ref_audio, ref_text, voice_file, save_voice, instruction, stream, resume,
        section_chars, lora):
    """Speak TEXT (or --text-file) and write it to --output.

    A --text-file of any length is spoken section by section straight to the file (bounded
    memory; --resume continues after an interruption): see docs/longform.md.
    """
    import mizuoto
    from mizuoto.contracts import Reference, Voice
    from mizuoto.service import plan_speech, speech_order

    quiet = ctx.obj["quiet"]
    if text_file is not None:
        text_file = _readable_again(ctx, text_file)
    long_form = (text_file is not None or resume or section_chars is not None) and not stream
    _check_files(output, text_file, ref_audio, ref_text, voice_file, save_voice, resume,
                 long_form)
    # OpenMP's wait policy before anything imports torch (Voice.load does, below)
    options = options_to_load(options_file, option_pairs, serving=False)
    # The speech service's order, before the model loads: a bad request fails in
    # milliseconds, naming its flag.
    text_flag = {"text": "--text-file"} if text_file else {}
    with cli_names(**text_flag):
        order = speech_order(
            _first_section(text_file) if long_form else _read_text(text, text_file),
            reference=Reference(ref_audio, ref_text) if ref_audio else None,
            voice=Voice.load(voice_file) if voice_file else None,
            instruction=instruction, seed=seed, steps=steps, guidance=guidance,
            params=command_params(params),
        )
    with command_progress(quiet) as progress, cli_names(**text_flag):
        tts = mizuoto.load(model, engine=engine, options=options, progress=progress,
                           request=order.request)
        if lora:
            _apply_lora(tts, lora)
        if save_voice:
            order = _save_voice(tts, order, save_voice)
        if long_form:
            applied = _speak_long_text(tts, order, output, text_file, resume=resume,
                                       section_chars=section_chars, progress=progress,
                                       quiet=quiet)
        else:
            # planned once by the engine (the seed drawn there when unset), run as planned
            planned = plan_speech(tts, order)
            if stream:
                applied = _speak_streamed(tts, planned, output, progress)
            else:
                applied = _speak(tts, planned, output, progress)
    check_written(output)
    report_written(applied, output, quiet)


def _check_files(output, text_file, ref_audio, ref_text, voice_file, save_voice, resume,
                 long_form) -> None:
    """The flags that go together and the files they name, before anything is read."""
    from mizuoto.output_paths import check_distinct, check_output_file

    if ref_text and not ref_audio:
        raise InvalidRequest("--ref-text", "needs --ref-audio")
    if save_voice and not ref_audio:
        raise InvalidRequest("--save-voice", "needs --ref-audio")
    if long_form and text_file is None:
        raise InvalidRequest("--resume" if resume else "--section-chars", "needs --text-file")
    check_audio_output(output, keeps_files_beside=long_form)
    if save_voice:
        check_output_file(save_voice, "--save-voice")
    inputs = (("--ref-audio", ref_audio), ("--voice", voice_file), ("--text-file", text_file))
    check_distinct(("--output", output), ("--save-voice", save_voice), *inputs)
    check_distinct(("--save-voice", save_voice), *inputs)


def _readable_again(ctx, text_file: str) -> str:
    """``text_file`` as a path that can be read more than once: a long text is checked, then
    spoken, then read again to resume. Standard input (``-``), a pipe or ``/dev/stdin`` is
    copied once to a temporary file (on disk: any length), removed when the command ends."""
    import os
    import shutil
    import stat
    import sys
    import tempfile

    if text_file != "-":
        try:
            if stat.S_ISREG(os.stat(text_file).st_mode):
                return text_file
        except OSError as exc:
            raise InvalidRequest("--text-file", f"cannot read {text_file}: "
                                 f"{exc.strerror or exc}") from None
    with tempfile.NamedTemporaryFile("wb", prefix="mizuoto-text-", suffix=".txt",
                                     delete=False) as copy:
        ctx.call_on_close(lambda: os.unlink(copy.name))
        try:
            if text_file == "-":
                shutil.copyfileobj(sys.stdin.buffer, copy)
            else:
                with open(text_file, "rb") as source:
                    shutil.copyfileobj(source, copy)
        except OSError as exc:
            raise InvalidRequest("--text-file", f"cannot read {text_file}: "
                                 f"{exc.strerror or exc}") from None
    return copy.name


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


def _apply_lora(tts, lora) -> None:
    from mizuoto.contracts.features import lora_engine

    lora_engine(tts, "--lora").set_lora(lora)


def _save_voice(tts, order, path):
    """Build the voice of ``order``'s reference, save it to ``path`` (``--save-voice``) and
    speak with it: the order that uses the saved voice instead of the recording."""
    import attrs

    voice = tts.build_voice(order.request.reference)
    voice.save(path)
    log.info("saved voice to %s", path)
    return attrs.evolve(order, request=attrs.evolve(order.request, reference=None,
                                                    voice=voice))


def _speak(tts, planned, output, progress):
    """The whole text at once, written when it is done."""
    from mizuoto.contracts import SynthesisResult
    from mizuoto.service import speak

    [whole] = speak(tts, planned, stream=False, progress=progress)
    SynthesisResult(whole.audio, whole.applied).save(output)
    return whole.applied


def _speak_streamed(tts, planned, output, progress):
    """``--stream``: the engine's chunks, written to the file as they come."""
    from mizuoto.audio_encoding import write_stream  # numpy: not at the top (mizuoto --help)
    from mizuoto.contracts import Capability
    from mizuoto.service import speak

    tts.require(Capability.STREAM)
    return write_stream(speak(tts, planned, stream=True, progress=progress), output,
                        tts.info.sample_rate, field="--output",
                        on_chunk=lambda n, s: _streamed(progress, n, s, "written"))


def _speak_long_text(tts, order, output, text_file, *, resume, section_chars, progress,
                     quiet):
    """``--text-file``: a text of any length, section by section straight to the file,
    resumable (``--resume``), planned once for all its sections; see docs/longform.md."""
    from mizuoto.longform import DEFAULT_SECTION_CHARS, synthesize_to
    from mizuoto.service import plan_document

    document = plan_document(tts, order)
    done = synthesize_to(tts, output, document, text_file=text_file, resume=resume,
                         max_chars=section_chars or DEFAULT_SECTION_CHARS,
                         progress=progress, resume_hint="--resume")
    if not done.complete:
        raise MizuotoError(f"{output} was not written: {done.sections_done} of "
                           f"{done.sections} sections are done; rerun with --resume")
    if not quiet:
        click.echo(f"{done.sections} sections ({done.resumed_at} resumed), "
                   f"{done.seconds:.1f} s of audio", err=True)
    return done.applied


def _streamed(progress, chunks: int, seconds: float, state: str) -> None:
    if progress is not None:
        from mizuoto.contracts.progress import report

        report(progress, STREAMED, chunks, None, f"{seconds:.2f} s of audio {state}")


def _hidden_alias(command: click.Command, name: str) -> click.Command:
    alias = copy.copy(command)
    alias.name, alias.hidden = name, True
    return alias


# `synth` is an older name of `say`: it still works, and --help lists `say` only
COMMANDS = (say, _hidden_alias(say, "synth"))
