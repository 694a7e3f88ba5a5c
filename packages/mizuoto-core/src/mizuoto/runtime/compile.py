"""Optional ``torch.compile`` (``compute.compile``) that falls back to eager when it fails.

``torch.compile`` wraps lazily: a missing compiler toolchain or an unsupported op shows up on
the first call, not when wrapping. So the compiled callable is guarded: if a call fails, the
same call is run eagerly; when that works, compiling is given up for good (with a warning),
and when it fails too, the eager error is raised as it would be without compiling.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Callable[..., Any])


def maybe_compile(target: T, enabled: bool, *, mode: str | None = None,
                  **compile_kwargs: Any) -> tuple[T, str | None]:
    """Compile ``target`` (a module or function) when ``enabled``; return it and a note.

    A module is compiled in place (its ``forward`` is replaced), so it is still the same
    object with the same ``state_dict`` keys; a function comes back wrapped. The note is
    ``None`` when compiling was not asked for or was set up, else why it was not; a failure
    on a later call is logged and recorded in ``target.compile_fallback_note``.
    ``compile_kwargs`` go to ``torch.compile`` (e.g. ``backend``, ``dynamic``).
    """
    if not enabled:
        return target, None
    compile_fn = getattr(torch, "compile", None)
    if compile_fn is None:
        return target, f"torch.compile is not available in torch {torch.__version__}"
    eager = target.forward if isinstance(target, nn.Module) else target
    try:
        compiled = compile_fn(eager, mode=mode, **compile_kwargs)
    except Exception as exc:  # e.g. unsupported Python version or platform
        return target, f"torch.compile failed, running eagerly: {exc}"
    if isinstance(target, nn.Module):
        target.compile_fallback_note = None
        target.forward = _guarded(
            compiled, eager, lambda note: setattr(target, "compile_fallback_note", note))
        return target, None
    guarded = _guarded(compiled, eager, lambda note: None)
    return guarded, None


def _guarded(compiled: Callable[..., Any], eager: Callable[..., Any],
             record: Callable[[str], None]) -> Callable[..., Any]:
    """Call ``compiled``; on failure rerun eagerly and stay eager.

    A call that failed after changing state (a cache filled in place) is not undone before
    the eager rerun; the modules Mizuoto compiles are pure functions of their inputs.
    """
    state = {"compiled": True}

    @functools.wraps(eager)
    def call(*args: Any, **kwargs: Any) -> Any:
        if state["compiled"]:
            try:
                return compiled(*args, **kwargs)
            except Exception as exc:
                result = eager(*args, **kwargs)  # raises the genuine error if there is one
                state["compiled"] = False
                note = f"torch.compile failed, running eagerly: {type(exc).__name__}: {exc}"
                logger.warning(note.splitlines()[0])
                call.compile_fallback_note = note
                record(note)
                return result
        return eager(*args, **kwargs)

    call.compile_fallback_note = None
    return call
