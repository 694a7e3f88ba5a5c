"""What a command line sets: options (``--options-file``, ``--option``) and request params
(``--param``), shared by ``mizuoto say``/``edit``/``batch``/``serve`` and ``mizuoto bench``.

Its own module so that the benchmark command does not import the CLI that imports it. The
imports inside the functions keep ``mizuoto --help`` from importing the registry (plugins).
"""

from __future__ import annotations

import os

import click

from mizuoto.errors import InvalidRequest
from mizuoto.key_values import parse_pairs


def command_options(option_file, option_pairs):
    """The options of ``--options-file`` and ``--option key=value``; a bad
    ``engines.<name>.*`` value fails here, before any loading."""
    from mizuoto.options import Options
    from mizuoto.registry import validate_engine_options

    options = Options.from_toml(option_file) if option_file else Options()
    options = options.with_overrides(option_pairs) if option_pairs else options
    validate_engine_options(options)  # a typo in engines.<name>.* fails before any loading
    return options


def options_to_load(option_file, option_pairs, *, serving=True):
    """:func:`command_options` for a command that loads the model in this process: first
    set OpenMP's wait policy (unless the user chose one: passive for a long-lived process,
    ``serving``, the default as before, or on a busy machine; a one-shot command passes
    ``serving=False`` to spin on an idle one) and restart it with the allocator preloaded
    and the threads bound when the options ask for them, before torch is imported. Only the command itself restarts (``main``): a program
    invoking ``cli`` in its own process gets the load's error saying how to start with
    them."""
    from mizuoto.runtime.startup import (
        RESTARTED_ENV,
        restart,
        set_wait_policy,
        startup_environment,
    )

    options = command_options(option_file, option_pairs)
    # before torch is imported; a restart inherits it
    set_wait_policy(options.compute, serving=serving)
    environment = startup_environment(options.compute)
    # the guard against a second restart is for this process: its own children start afresh
    os.environ.pop(RESTARTED_ENV, None)
    if environment is not None and click.get_current_context().obj.get("may_restart"):
        restart(environment)
    return options


def command_params(pairs):
    """``--param key=value`` pairs as request params (values parsed as options' are)."""
    return parse_pairs(pairs, lambda pair: InvalidRequest(
        "--param", f"{pair!r} must be written key=value"))
