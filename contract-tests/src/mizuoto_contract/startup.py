"""The start-time CPU options (``compute.cpu_allocator``, ``compute.cpu_pinning``) leave an
engine's audio bit-identical: a check for a plugin's own tests.

    @pytest.mark.parametrize("variant", STARTUP_VARIANTS)
    def test_cpu_startup_options_keep_audio(variant, model_dir, tmp_path):
        check_startup_variant_keeps_audio("f5tts", model_dir, REQUEST, variant, tmp_path)

Each run is a fresh interpreter started as the ``mizuoto`` command would restart itself
(:func:`mizuoto.runtime.startup.startup_environment`), on two threads, compared with a run with
neither option by ``torch.equal``. A library that is not installed skips the variant, or fails
it under ``MIZUOTO_REQUIRE_ALLOCATORS=1`` (set by the nox sessions, which install them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The variants checked, each against a plain start ("default"): each allocator, one of them
#: with the threads pinned (a fresh interpreter costs seconds; three per engine is enough).
STARTUP_VARIANTS = ("jemalloc", "tcmalloc+pinning")
#: Under this variable a missing allocator library fails the check instead of skipping it.
REQUIRE_ALLOCATORS_ENV = "MIZUOTO_REQUIRE_ALLOCATORS"

# Two threads: a parallel reduction splits its work, so pinning could show if it mattered.
_THREADS = 2
_START_VARIABLES = ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", "MIZUOTO_RESTARTED")
# the plain start's result, per (engine, model directory, request): run once, for every variant
_PLAIN_RUNS: dict[tuple[str, str, str], dict[str, Any]] = {}

_CHILD = """
import json, os, sys
import torch
import mizuoto
from mizuoto import Options, SynthesisRequest

engine, model_dir, compute, request, out = sys.argv[1:6]
tts = mizuoto.load(model_dir, engine=engine,
                   options=Options.from_mapping({"compute": json.loads(compute)}))
fields = json.loads(request)
if "reference" in fields:  # {"audio": path, "text": ...}: an engine that only clones
    fields["reference"] = mizuoto.Reference(**fields["reference"])
result = tts.synthesize(SynthesisRequest(**fields))
threads = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
torch.save({"samples": result.audio.samples, "compute": dict(result.applied.compute),
            "affinities": threads}, out)
"""


def variant_compute(variant: str) -> dict[str, Any]:
    """The ``compute.*`` options of ``variant`` (``"default"`` or one of STARTUP_VARIANTS)."""
    compute: dict[str, Any] = {"device": "cpu", "cpu_threads": _THREADS}
    for part in variant.split("+"):
        if part in ("jemalloc", "tcmalloc"):
            compute["cpu_allocator"] = part
        elif part == "pinning":
            compute["cpu_pinning"] = True
        elif part != "default":
            raise ValueError(f"unknown variant part {part!r}")
    return compute


def variant_environment(variant: str) -> dict[str, str]:
    """The environment a process of ``variant`` starts with: this one's, less any allocator
    or binding it has, plus what :func:`startup_environment` adds for the variant."""
    from mizuoto.errors import InvalidOption
    from mizuoto.options import ComputeOptions
    from mizuoto.runtime.startup import startup_environment

    base = {k: v for k, v in os.environ.items() if k not in _START_VARIABLES}
    compute = ComputeOptions(**variant_compute(variant))
    try:
        # loaded_allocator() of this process does not matter: base has no LD_PRELOAD, so the
        # restart environment is built as for a plain start
        environment = startup_environment(compute, base)
    except InvalidOption as exc:
        if os.environ.get(REQUIRE_ALLOCATORS_ENV) == "1":
            pytest.fail(f"{exc} ({REQUIRE_ALLOCATORS_ENV}=1: the test environment installs it)")
        pytest.skip(str(exc))
    return environment or base


def synthesize_in_fresh_process(engine: str, model_dir: str | Path, request: dict[str, Any],
                                variant: str, workdir: str | Path) -> dict[str, Any]:
    """Run ``request`` on a fresh interpreter of ``variant``; its samples, ``applied.compute``
    and the CPU affinity of each of its threads."""
    out = Path(workdir) / f"{variant}.pt"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, engine, str(model_dir),
         json.dumps(variant_compute(variant)), json.dumps(request), str(out)],
        capture_output=True, text=True, env=variant_environment(variant), timeout=300)
    assert done.returncode == 0, f"{variant} run failed:\n{done.stderr[-3000:]}"
    import torch

    return torch.load(out)


def check_startup_variant_keeps_audio(engine: str, model_dir: str | Path,
                                      request: dict[str, Any], variant: str,
                                      workdir: str | Path) -> None:
    """``variant``'s audio equals that of a plain start (``torch.equal``; the plain run is
    made once per engine, model and request), and its result reports the allocator and
    binding in effect (pinned threads each confined to part of the CPUs)."""
    import torch

    key = (engine, str(model_dir), json.dumps(request, sort_keys=True))
    if key not in _PLAIN_RUNS:
        _PLAIN_RUNS[key] = synthesize_in_fresh_process(engine, model_dir, request, "default",
                                                       workdir)
    plain = _PLAIN_RUNS[key]
    run = synthesize_in_fresh_process(engine, model_dir, request, variant, workdir)
    compute = variant_compute(variant)
    assert plain["compute"]["cpu_allocator"] == "default"
    assert run["compute"]["cpu_allocator"] == compute.get("cpu_allocator", "default")
    assert run["compute"]["cpu_threads"] == plain["compute"]["cpu_threads"] == _THREADS
    assert run["compute"]["cpu_pinning"] is compute.get("cpu_pinning", False)
    cpus = len(os.sched_getaffinity(0))
    if compute.get("cpu_pinning") and cpus > 1:
        assert all(len(cpu_set) < cpus for cpu_set in run["affinities"]), run["affinities"]
    assert torch.equal(run["samples"], plain["samples"]), (
        f"{variant} changed the audio: max |diff| "
        f"{(run['samples'] - plain['samples']).abs().max()}")
