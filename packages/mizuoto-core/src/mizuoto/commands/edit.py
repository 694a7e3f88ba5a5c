"""``mizuoto edit``: regenerate spans of a recording so that it says a new text."""

from __future__ import annotations

import click

from mizuoto.commands.toolkit import (
    check_audio_output,
    check_written,
    cli_names,
    command_params,
    command_progress,
    model_options,
    options_to_load,
    report_written,
)
from mizuoto.errors import InvalidRequest


@click.command()
@click.argument("text")
@model_options
@click.option("--ref-audio", required=True, type=click.Path(dir_okay=False), help="The recording to edit.")
@click.option("--ref-text", required=True, help="Its transcript.")
@click.option("--segment", "segments", multiple=True, required=True, metavar="START:END", help="Span in seconds to regenerate (repeatable).")
@click.pass_context
def edit(ctx, text, model, engine, output, seed, steps, guidance, params, option_pairs,
         options_file, ref_audio, ref_text, segments):
    """Replace spans of a recording so that it says TEXT."""
    import mizuoto
    from mizuoto.contracts import Capability, EditRequest, Reference

    check_audio_output(output)
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
    options = options_to_load(options_file, option_pairs, serving=False)
    with command_progress(ctx.obj["quiet"]) as progress, cli_names():
        _check_params(model, engine, options, command_params(params))
        tts = mizuoto.load(model, engine=engine, options=options, progress=progress)
        tts.require(Capability.EDIT)
        result = tts.edit(EditRequest(Reference(ref_audio, ref_text), text, spans, seed=seed,
                                      steps=steps, guidance=guidance,
                                      params=command_params(params)),
                          progress=progress)
        result.save(output)
    check_written(output)
    report_written(result.applied, output, ctx.obj["quiet"])


def _check_params(model, engine, options, params) -> None:
    """A mistyped --param fails before the weights load (with the closest setting), as in
    ``say``: resolving the model now costs nothing the load would not."""
    from mizuoto.loading import check_params_before_load

    check_params_before_load(model, params, engine=engine, options=options)


COMMANDS = (edit,)
