"""Configurations and their children: each measurement in a fresh ``python -m mizuoto
bench-run`` process, the configurations taking turns run by run so that whatever else loads
the machine meanwhile falls on all of them alike."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from mizuoto.benchmarking.spec import RunSpec
from mizuoto.errors import InvalidRequest, MizuotoError

log = logging.getLogger(__name__)

#: The line a child prints its measurement on (stdout; anything else there is ignored).
RESULT_PREFIX = "MIZUOTO-BENCH "
BASE = "base"
UPSTREAM = "upstream"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@attrs.frozen
class Configuration:
    """A measured configuration: its name, the side and the ``--option`` overrides it adds to
    the base configuration's."""

    name: str
    side: str = "mizuoto"
    option_pairs: tuple[str, ...] = attrs.field(default=(), converter=tuple)


def parse_compare(text: str) -> Configuration:
    """``NAME:key=value,key=value`` (``--compare``) as a configuration."""
    name, colon, pairs = text.partition(":")
    name = name.strip()
    if not colon or not _NAME.fullmatch(name):
        raise InvalidRequest("--compare", f"{text!r} must be NAME:key=value[,key=value...]",
                             "e.g. --compare compiled:compute.compile=true")
    if name in (BASE, UPSTREAM):
        raise InvalidRequest("--compare", f"{name!r} names a configuration of its own",
                             "choose another name")
    overrides = tuple(pair.strip() for pair in pairs.split(",") if pair.strip())
    if not overrides:
        raise InvalidRequest("--compare", f"{text!r} sets no option", "e.g. NAME:key=value")
    for pair in overrides:
        if "=" not in pair:
            raise InvalidRequest("--compare", f"{pair!r} in {text!r} must be written key=value")
    return Configuration(name, "mizuoto", overrides)


def schedule(configurations: Sequence[Configuration], runs: int
             ) -> list[tuple[int, Configuration]]:
    """Run by run, the configurations in an order that rotates each run: over ``len``
    runs each configuration is measured once in each position (first, second, ...)."""
    order = []
    for run in range(runs):
        shift = run % len(configurations)
        order += [(run, c) for c in (*configurations[shift:], *configurations[:shift])]
    return order


class ChildFailed(MizuotoError):
    """A measurement's child process failed; the message holds the end of its stderr and the
    exit code is the child's (a refused option is still exit code 2)."""

    def __init__(self, configuration: str, returncode: int, stderr: str) -> None:
        self.exit_code = returncode if returncode in (2, 3, 4) else 1
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("Error: ")]
        detail = errors[-1].removeprefix("Error: ") if errors else "\n".join(lines[-20:])
        super().__init__(f"configuration {configuration!r} failed (exit code {returncode}): "
                         f"{detail}")


def child_environment(threads: int | None, base: Mapping[str, str] | None = None
                      ) -> dict[str, str]:
    """The children's environment: ours, with the thread count pinned for OpenMP and MKL
    when ``--threads`` is given (identically for every configuration)."""
    environment = dict(os.environ if base is None else base)
    if threads is not None:
        environment.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return environment


def run_child(configuration: Configuration, spec: RunSpec, environment: Mapping[str, str]
              ) -> dict[str, Any]:
    """Measure ``spec`` in a fresh interpreter; its measurement."""
    command = [sys.executable, "-m", "mizuoto", "--quiet", "bench-run", spec.to_json()]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(environment),
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise ChildFailed(configuration.name, done.returncode, done.stderr)
    return json.loads(lines[-1].removeprefix(RESULT_PREFIX))


def run_all(plan: Sequence[tuple[Configuration, RunSpec]], runs: int,
            environment: Mapping[str, str],
            on_measured: Callable[[int, Configuration, dict], None] | None = None,
            run: Callable[[Configuration, RunSpec, Mapping[str, str]], dict] = run_child,
            ) -> dict[str, list[dict[str, Any]]]:
    """Every configuration ``runs`` times, taking turns (:func:`schedule`); the
    measurements by configuration name, in run order."""
    specs = {configuration.name: spec for configuration, spec in plan}
    measured: dict[str, list[dict[str, Any]]] = {c.name: [] for c, _ in plan}
    for index, configuration in schedule([c for c, _ in plan], runs):
        measurement = run(configuration, specs[configuration.name], environment)
        measured[configuration.name].append(measurement)
        if on_measured is not None:
            on_measured(index, configuration, measurement)
    return measured
