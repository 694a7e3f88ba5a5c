"""The ``mizuoto bench`` command, and ``mizuoto bench-run`` (hidden): one measurement, run by
``mizuoto bench`` in a child process. Imports no torch while measuring (the children do; the
mel SNR of the side-by-side columns imports it after the last child)."""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mizuoto.benchmarking.runner import BASE, RESULT_PREFIX, UPSTREAM, Configuration
from mizuoto.errors import InvalidRequest, MizuotoError, UnsupportedCapability

if TYPE_CHECKING:
    from mizuoto.contracts.fixtures import ContractFixture

log = logging.getLogger("mizuoto")

RANDOM_PREFIX = "random:"
DEFAULT_TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into "
                "the quiet green forest.")
_COMPLETE = ".mizuoto-random-model"  # written last: a directory without it is rewritten


@click.command(name="bench")
@click.argument("model")
@click.option("-e", "--engine", help="Engine name (default: from the catalog, the fixture or the directory).")
@click.option("--text", default=DEFAULT_TEXT, show_default="an English sentence of 101 characters", help="The text to speak.")
@click.option("--ref-audio", type=click.Path(exists=True, dir_okay=False), help="Reference recording (cloning engines; F5-TTS uses its default voice without one).")
@click.option("--ref-text", help="Transcript of the reference recording.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every request.")
@click.option("--steps", type=click.IntRange(1), help="Sampler steps (default: the fixture's, else the engine's).")
@click.option("--guidance", type=float, help="Guidance strength (engine default if unset).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Engine-specific request setting (repeatable).")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="Option of the base configuration, e.g. compute.dtype=float32 (repeatable).")
@click.option("--options-file", type=click.Path(exists=True, dir_okay=False), help="TOML file of options (the base configuration's).")
@click.option("--compare", "compares", multiple=True, metavar="NAME:KEY=VALUE[,KEY=VALUE]", help="Another configuration: the base's options plus these (repeatable).")
@click.option("--against-upstream", is_flag=True, help="Also run the upstream package the engine reproduces (where installed).")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True, help="Runs per configuration (each a fresh process).")
@click.option("--requests", type=click.IntRange(1), default=1, show_default=True, help="Requests per run; from the second on they are 'warm'.")
@click.option("--threads", type=click.IntRange(1), help="CPU threads in every run (compute.cpu_threads, OMP_NUM_THREADS).")
@click.option("--stream", is_flag=True, help="Request through the engine's stream: time to first audio (engines that stream).")
@click.option("--random-dir", type=click.Path(file_okay=False), help="Where a random: model is written (default $MIZUOTO_HOME/random-models/<id>); reused.")
@click.option("--profile", is_flag=True, help="One more request per run, timed per component (VoxCPM: base LM, residual LM, encoder, DiT, stop head, VAE; F5: transformer, vocoder), against the memory bandwidth measured first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
@click.pass_context
def bench(ctx, model, engine, text, ref_audio, ref_text, seed, steps, guidance, params,
          option_pairs, options_file, compares, against_upstream, runs, requests, threads,
          stream, random_dir, profile, as_json):
    """Measure MODEL: load time, real-time factor, time to first audio (--stream) and peak
    memory, over --runs fresh processes, configurations taking turns.

    MODEL is a catalog id, a model directory, or random:FIXTURE for a random-init model of an
    installed engine, written once and reused (e.g. random:voxcpm/tiny-2,
    random:f5tts/realsize-v1-base; `mizuoto random-model --help` lists them). See
    docs/performance.md.
    """
    from mizuoto.benchmarking.report import summarize, table
    from mizuoto.benchmarking.runner import child_environment, parse_compare, run_all
    from mizuoto.benchmarking.spec import RunSpec
    from mizuoto.command_options import command_options as _options
    from mizuoto.command_options import command_params as _params

    if ref_text and not ref_audio:
        raise InvalidRequest("--ref-text", "needs --ref-audio")
    configurations = [Configuration(BASE, "mizuoto", option_pairs)]
    for text_ in compares:
        compared = parse_compare(text_)
        if any(c.name == compared.name for c in configurations):
            raise InvalidRequest("--compare", f"two configurations are named {compared.name!r}")
        configurations.append(Configuration(compared.name, "mizuoto",
                                            (*option_pairs, *compared.option_pairs)))
    threads_pair = (f"compute.cpu_threads={threads}",) if threads is not None else ()
    for configuration in configurations:  # a typo fails here, before any model is written
        _options(options_file, (*configuration.option_pairs, *threads_pair))
    request_params = _params(params)
    model_arg, model_dir, engine, fixture = _resolve(model, engine, random_dir)
    if stream:
        _require_stream(engine)
    if against_upstream:
        _check_upstream(engine)
        configurations.append(Configuration(UPSTREAM, "upstream", option_pairs))
    if fixture is not None:  # its fast settings, under the ones given
        from mizuoto.output_paths import check_output_dir

        check_output_dir(model_dir, "--random-dir")
        _write_random(fixture, model_dir)
        request_params = {**fixture.request_params, **request_params}
        steps = steps if steps is not None else fixture.steps
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="mizuoto-bench-")  # each side's audio
    audio = {c.name: Path(scratch.name) / f"{c.name}.npy" for c in configurations}
    plan = [(c, RunSpec(side=c.side, model=model_arg, model_dir=str(model_dir), engine=engine,
                        text=text, seed=seed, option_pairs=(*c.option_pairs, *threads_pair),
                        options_file=options_file, ref_audio=ref_audio, ref_text=ref_text,
                        steps=steps, guidance=guidance, params=request_params, stream=stream,
                        requests=requests, threads=threads, profile=profile,
                        audio_path=str(audio[c.name])))
            for c in configurations]
    before = os.getloadavg()

    def progress(index, configuration, measurement):
        if not ctx.obj.get("quiet"):
            click.echo(f"run {index + 1}/{runs} {configuration.name}: request "
                       f"{measurement['request_s']:.2f} s, load {measurement['load_s']:.2f} s, "
                       f"peak RSS {measurement['peak_rss_mb']:.0f} MB", err=True)

    with scratch:
        measured = run_all(plan, runs, child_environment(threads), on_measured=progress)
        entries = summarize(configurations, measured, audio if len(configurations) > 1
                            else None)
    header = {"model": model, "model_dir": str(model_dir), "engine": engine, "text": text,
              "seed": seed, "steps": steps, "guidance": guidance, "params": request_params,
              "reference": ref_audio, "stream": stream, "runs": runs, "requests": requests,
              "threads": threads,
              "load_average": {"before": list(before), "after": list(os.getloadavg())},
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "platform": platform.platform()}
    if as_json:
        click.echo(json.dumps({**header, "configurations": entries}, indent=2))
    else:
        click.echo(table(header, entries))
        if profile:
            from mizuoto.benchmarking.profile import profile_table

            for entry in entries:
                profiled = [run["profile"] for run in entry["runs"] if run.get("profile")]
                if profiled:  # the run with the fastest profiled request
                    click.echo(f"\n{entry['name']} "
                               + profile_table(min(profiled, key=lambda p: p["request_s"])))


def _resolve(model: str, engine: str | None, random_dir: str | None
             ) -> tuple[str, Path, str, ContractFixture | None]:
    """What the children load (``mizuoto.load``'s argument), the directory upstream loads,
    the engine, and for ``random:`` the fixture (written later, once the arguments are
    checked)."""
    if model.startswith(RANDOM_PREFIX):
        from mizuoto.catalog import mizuoto_home
        from mizuoto.registry import random_models

        fixture_id = model.removeprefix(RANDOM_PREFIX)
        fixtures = random_models()
        if fixture_id not in fixtures:
            known = ", ".join(sorted(fixtures)) or "none (no engine installed)"
            raise InvalidRequest("MODEL", f"no random model {fixture_id!r}", f"known: {known}")
        fixture = fixtures[fixture_id]
        if engine is not None and engine != fixture.engine:
            raise InvalidRequest("--engine", f"{fixture_id} is a model of {fixture.engine!r}, "
                                 f"not {engine!r}")
        directory = Path(random_dir) if random_dir else \
            mizuoto_home() / "random-models" / fixture_id.replace("/", "--")
        return str(directory), directory, fixture.engine, fixture
    from mizuoto.loading import resolve_model
    from mizuoto.registry import engines

    resolved = resolve_model(model)  # downloads once, here, not in every child
    if engine is None and resolved.entry is not None:
        engine = resolved.entry.engine
    if engine is None:
        found = sorted(n for n, cls in engines().items() if cls.recognizes(resolved.path))
        if len(found) != 1:
            raise InvalidRequest("--engine", f"cannot tell which engine loads {resolved.path} "
                                 f"(recognized by: {', '.join(found) or 'none'})",
                                 "pass --engine")
        engine = found[0]
    return model, resolved.path, engine, None


def _write_random(fixture: ContractFixture, directory: Path) -> None:
    if (directory / _COMPLETE).is_file():
        if (directory / _COMPLETE).read_text().strip() != fixture.id:
            raise InvalidRequest("--random-dir", f"{directory} holds another random model",
                                 "give a directory of its own")
        log.info("using random model %s from %s (--random-dir to choose another)", fixture.id,
                 directory)
        return
    if directory.exists() and any(directory.iterdir()):
        raise InvalidRequest("--random-dir", f"{directory} is not empty and holds no complete "
                             "random model", "give an empty or new directory")
    log.info("writing random model %s to %s (kept for the next run; --random-dir to choose "
             "another)", fixture.id, directory)
    directory.mkdir(parents=True, exist_ok=True)
    # In a process of its own: building a real-size model's weights takes gigabytes, and on
    # Linux a child starts with its parent's peak RSS as its own (ru_maxrss survives fork and
    # exec), so every measured child of this command would report at least that peak.
    import subprocess

    done = subprocess.run([sys.executable, "-m", "mizuoto", "--quiet", "random-model",
                           fixture.id, str(directory)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RandomModelFailed(fixture.id, done.returncode, done.stderr)
    (directory / _COMPLETE).write_text(fixture.id + "\n")


class RandomModelFailed(MizuotoError):
    """Writing a ``random:`` model failed (in its own process); the end of its stderr."""

    def __init__(self, fixture: str, returncode: int, stderr: str) -> None:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        super().__init__(f"writing random model {fixture} failed (exit code {returncode}): "
                         + "\n".join(lines[-10:]))


def _require_stream(engine: str) -> None:
    from mizuoto.contracts.capabilities import Capability
    from mizuoto.registry import engine_refs

    if Capability.STREAM not in engine_refs()[engine].capabilities:
        raise UnsupportedCapability(f"--stream: engine {engine!r} does not stream; time to "
                                    f"first audio is measured for streaming engines only")


def _check_upstream(engine: str) -> None:
    import importlib.metadata

    from mizuoto.registry import upstream_baselines

    baseline = upstream_baselines().get(engine)
    if baseline is None:
        raise InvalidRequest("--against-upstream", f"engine {engine!r} registers no upstream "
                             "baseline (register_upstream_baselines)")
    try:
        importlib.metadata.version(baseline.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise InvalidRequest("--against-upstream", f"the upstream package "
                             f"{baseline.distribution!r} is not installed",
                             f"pip install {baseline.distribution} in this environment") \
            from None


@click.command(name="bench-run", hidden=True)
@click.argument("spec_json")
def bench_run(spec_json):
    """One measurement of `mizuoto bench`, in a process of its own (internal)."""
    from mizuoto.benchmarking.child import measure
    from mizuoto.benchmarking.spec import RunSpec
    from mizuoto.command_options import options_to_load as _options_to_load

    spec = RunSpec.from_json(spec_json)
    # Mizuoto's side goes through the same option path as `mizuoto say` (restarting with the
    # allocator and thread binding its configuration asks for)
    options = _options_to_load(spec.options_file, spec.option_pairs, serving=False)
    result = measure(spec, options)
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
