"""``mizuoto batch``: speak every line of a file into a folder, resumably, on local worker
processes or Ray actors."""

from __future__ import annotations

import click

from mizuoto.batch.run import MAX_WORKERS
from mizuoto.commands.toolkit import (
    FormatChoice,
    command_params,
    command_progress,
    options_to_load,
)


@click.command()
@click.argument("input_file", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.option("-m", "--model", required=True, help="Catalog id or model directory (loaded once).")
@click.option("-e", "--engine", help="Engine name (default: from the catalog or the directory).")
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder for <id>.<format> files and manifest.jsonl.")
@click.option("--format", "file_format", type=FormatChoice(), default="wav", show_default=True, help="Audio format of the files written.")
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
    defaults = {"steps": steps, "guidance": guidance, "params": command_params(params)}
    job = BatchJob(input_file, output_dir, file_format,
                   {key: value for key, value in defaults.items() if value not in (None, {})})
    count_lines(job.input)  # an input unreadable as a whole (encoding, quoting, header)
    settings = None
    if ray_address:
        from mizuoto.batch.ray import RaySettings

        settings = RaySettings(None if ray_address == "local" else ray_address, ray_actors,
                               ray_cpus, ray_gpus)
    options = options_to_load(options_file, option_pairs, serving=True)
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
    with command_progress(ctx.obj["quiet"]) as progress:
        summary = run_batch(job, load=loader, workers=workers, progress=progress,
                            records=records)
    click.echo(f"{summary.lines} lines: {summary.ok} written, {summary.skipped} already done, "
               f"{summary.failed} failed; manifest {summary.manifest}", err=True)
    if summary.failed:
        ctx.exit(5)


COMMANDS = (batch,)
