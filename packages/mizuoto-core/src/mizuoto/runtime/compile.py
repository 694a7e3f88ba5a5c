"""Optional ``torch.compile`` (``compute.compile``) that falls back to eager when it fails.

``torch.compile`` wraps lazily: a missing compiler toolchain or an unsupported op shows up on
the first call, not when wrapping. So the compiled callable is guarded: if a call fails, the
same call is run eagerly; when that works, compiling is given up for good (with a warning),
and when it fails too, the eager error is raised as it would be without compiling. A module
on the CPU compiled by inductor first looks for inductor's C++ compiler: without one it stays
eager from the start, saying so, rather than failing after seconds of tracing.

Engines call :func:`compile_module` at load and report its :class:`Compilation` in each
result (``applied.compute["compile"]``, and the note in ``applied.fallbacks``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import torch
from torch import nn

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Callable[..., Any])

#: The ``torch.compile`` backend used when the caller names none. The unit tests set
#: ``"eager"`` (dynamo's graph capture, run op by op: the wiring in seconds, same bits) because
#: inductor needs tens of seconds even for a tiny model on two cores.
BACKEND: str | Callable[..., Any] = "inductor"


@attrs.frozen
class Compilation:
    """What became of ``compute.compile`` for one module: whether it was asked for, and why
    the module runs eagerly although it was (set-up failed, or a compiled call did)."""

    requested: bool
    module: nn.Module | None = attrs.field(default=None, eq=False, repr=False)
    setup_note: str | None = None

    @property
    def note(self) -> str | None:
        """Why the module runs eagerly although compiling was asked for, else ``None``."""
        if not self.requested:
            return None
        return self.setup_note or getattr(self.module, "compile_fallback_note", None)

    @property
    def active(self) -> bool:
        """True while the module runs compiled (results are then not bit-exact)."""
        return self.requested and self.note is None

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """For ``Applied.fallbacks``: the note, when compiling was asked for and given up."""
        note = self.note
        return (note,) if note else ()


def compile_module(module: nn.Module, enabled: bool, **compile_kwargs: Any) -> Compilation:
    """Compile ``module`` in place when ``enabled`` (see :func:`maybe_compile`)."""
    _, note = maybe_compile(module, enabled, **compile_kwargs)
    if note:
        logger.warning("%s", note)
    return Compilation(enabled, module, note)


def maybe_compile(target: T, enabled: bool, *, mode: str | None = None,
                  **compile_kwargs: Any) -> tuple[T, str | None]:
    """Compile ``target`` (a module or function) when ``enabled``; return it and a note.

    A module is compiled in place (its ``forward`` is replaced), so it is still the same
    object with the same ``state_dict`` keys; a function comes back wrapped. The note is
    ``None`` when compiling was not asked for or was set up, else why it was not; a failure
    on a later call is logged and recorded in ``target.compile_fallback_note``.
    ``compile_kwargs`` go to ``torch.compile`` (e.g. ``backend``, ``dynamic``); the backend
    defaults to :data:`BACKEND`.
    """
    if not enabled:
        return target, None
    compile_fn = getattr(torch, "compile", None)
    if compile_fn is None:
        return target, f"torch.compile is not available in torch {torch.__version__}"
    compile_kwargs.setdefault("backend", BACKEND)
    if compile_kwargs["backend"] == "inductor" and _on_cpu(target):
        missing = _missing_cpp_compiler()
        if missing:
            return target, f"torch.compile is off, running eagerly: {missing}"
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


def _on_cpu(target: Any) -> bool:
    if not isinstance(target, nn.Module):
        return False
    parameter = next(target.parameters(), None)
    return parameter is not None and parameter.device.type == "cpu"


def _missing_cpp_compiler() -> str | None:
    """Why inductor cannot build CPU kernels here (no working C++ compiler), else ``None``."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # another torch layout: the guarded call still falls back
        return None
    try:
        get_cpp_compiler()
    except Exception as exc:  # InvalidCxxCompiler; its message names the compilers tried
        return (f"{exc} (install g++ or clang, or set CXX to a C++ compiler, for "
                f"compute.compile on the CPU)")
    return None


def _strict_recompiles() -> contextlib.AbstractContextManager:
    """Past ``torch._dynamo.config.recompile_limit`` (new shapes, dtypes, LoRA layouts) dynamo
    silently runs the function eagerly; made an error here, so the fallback is recorded and a
    result never says compiled when it was not."""
    config = torch._dynamo.config
    if not hasattr(config, "fail_on_recompile_limit_hit"):
        return contextlib.nullcontext()
    return config.patch(fail_on_recompile_limit_hit=True)


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
                with _strict_recompiles():
                    return compiled(*args, **kwargs)
            except Exception as exc:
                result = eager(*args, **kwargs)  # raises the genuine error if there is one
                state["compiled"] = False
                note = f"torch.compile failed, running eagerly: {_reason(exc)}"
                logger.warning("%s", note)
                call.compile_fallback_note = note
                record(note)
                return result
        return eager(*args, **kwargs)

    call.compile_fallback_note = None
    return call


def _reason(exc: Exception) -> str:
    """The exception in one line (dynamo appends paragraphs of debugging advice)."""
    if type(exc).__name__ == "FailOnRecompileLimitHit":
        return ("recompiled more than torch._dynamo.config.recompile_limit times (new shapes, "
                "dtypes or layers)")
    # dynamo's BackendCompilerFailed says which backend raised, then the backend's error
    exc = getattr(exc, "inner_exception", None) or exc
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
