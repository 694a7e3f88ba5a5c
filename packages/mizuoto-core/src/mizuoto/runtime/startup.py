"""Options that act only from the start of a process: ``compute.cpu_allocator`` (a preloaded
malloc), ``compute.cpu_pinning`` (OpenMP's thread binding, read when torch is imported) and
``compute.cpu_wait_policy`` (OpenMP's wait policy, read then too).

Every engine's load checks them (:func:`check_startup_options`, run by the base class): asked
for and not in effect, the load is refused with how to start the process with them. The
``mizuoto`` command instead restarts itself with them (:func:`startup_environment`,
:func:`restart`) before it imports torch or loads a model. Imports no torch.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from mizuoto.errors import InvalidOption
from mizuoto.options import ComputeOptions
from mizuoto.runtime.allocator import (
    check_cpu_allocator,
    find_allocator_library,
    install_hint,
    loaded_allocator,
    preload_list,
)
from mizuoto.runtime.threads import (
    PINNING_ENVIRONMENT,
    WAIT_POLICY_ENV,
    apply_cpu_wait_policy,
    wait_policy_environment,
)

logger = logging.getLogger(__name__)

#: Set in the restarted process: a process restarts itself once at most.
RESTARTED_ENV = "MIZUOTO_RESTARTED"


def check_startup_options(compute: ComputeOptions) -> None:
    """Raise :class:`InvalidOption` for an allocator or a thread binding asked for that this
    process does not run with."""
    check_cpu_allocator(compute.cpu_allocator)
    apply_cpu_wait_policy(compute)
    if compute.cpu_pinning:
        from mizuoto.runtime.threads import check_cpu_pinning  # imports torch

        check_cpu_pinning(compute)


def startup_environment(compute: ComputeOptions, environ: Mapping[str, str] | None = None
                        ) -> dict[str, str] | None:
    """The environment to restart this process with so that ``compute``'s start-time options
    take effect, or ``None`` when it already runs with them or was restarted once already (its
    engine's load then says what is still missing).

    Raises :class:`InvalidOption` when the allocator asked for is not on the system.
    """
    environ = dict(os.environ if environ is None else environ)
    changes: dict[str, str] = {}
    wanted = compute.cpu_allocator
    if wanted != "default" and loaded_allocator() != wanted:
        library = find_allocator_library(wanted, environ=environ)
        if library is None:
            raise InvalidOption("compute.cpu_allocator", f"lib{wanted} was not found on this "
                                f"system: {install_hint(wanted)}")
        changes["LD_PRELOAD"] = preload_list(library, environ.get("LD_PRELOAD", ""))
    if compute.cpu_pinning and environ.get("OMP_PROC_BIND", "false").lower() == "false":
        changes.update(PINNING_ENVIRONMENT)
        if compute.cpu_threads is not None:  # OpenMP's team is then built at that size
            changes["OMP_NUM_THREADS"] = str(compute.cpu_threads)
    if not changes or environ.get(RESTARTED_ENV):
        return None
    return {**environ, **changes, RESTARTED_ENV: "1"}


def set_wait_policy(compute: ComputeOptions, *, serving: bool = True) -> None:
    """Set ``OMP_WAIT_POLICY`` in this process's environment for ``compute.cpu_wait_policy``
    (``auto``: the user's if set, else passive for a server (``serving``) or a busy machine and
    active on an idle one: :func:`~mizuoto.runtime.threads.auto_wait_policy`) while torch is
    not imported yet: OpenMP reads
    it then, and the processes this one starts (a restart, server workers) inherit it. No
    restart is needed for it. Once torch is imported it is too late: nothing is set (the load
    refuses an explicit policy not in effect)."""
    if "torch" in sys.modules:
        logger.debug("torch is imported: %s stays %s", WAIT_POLICY_ENV,
                     os.environ.get(WAIT_POLICY_ENV, "unset"))
        return
    changes = wait_policy_environment(compute, os.environ, serving=serving)
    if not changes:
        return
    logger.debug("setting %s", " ".join(f"{k}={v}" for k, v in changes.items()))
    os.environ.update(changes)


def restart(environment: Mapping[str, str]) -> NoReturn:
    """Replace this process with the same command (interpreter, its flags and arguments) in
    ``environment``; output written so far is flushed first."""
    changed = {k: v for k, v in environment.items() if os.environ.get(k) != v}
    logger.info("restarting with %s", " ".join(f"{k}={v}" for k, v in sorted(changed.items())))
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv keeps "-m mizuoto" and interpreter flags; sys.argv would run __main__.py
    # as a script
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], dict(environment))
