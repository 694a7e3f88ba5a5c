"""Errors raised by Mizuoto and its engines.

Every error says what is wrong and how to fix it. The CLI maps each class to an exit code
(``exit_code``) so scripts can tell a bad request from a missing model.
"""

from __future__ import annotations

import errno


class MizuotoError(Exception):
    """Base class of every error Mizuoto raises on purpose."""

    exit_code = 1

    def __reduce__(self):
        # an error crosses processes (a Ray replica's reaches the ingress) as it was raised:
        # the default rebuilds it as cls(*args), which a subclass taking (field, problem, fix)
        # refuses, and Ray then reports an unpicklable error in its place (a 500)
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[MizuotoError], args: tuple, state: dict) -> MizuotoError:
    """An error of ``cls`` with ``args`` and attributes ``state``, without its ``__init__``."""
    error = cls.__new__(cls, *args)
    BaseException.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InvalidRequest(MizuotoError, ValueError):
    """A request field has a bad value. ``field`` names it; the message says the fix."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class UnsupportedSetting(InvalidRequest):
    """A setting the engine does not have, given a value other than its neutral one (``speed``
    on an engine without it): refused rather than silently ignored."""


class InvalidAudio(InvalidRequest):
    """Audio that cannot be read, is empty or is silent."""


class OutputNotWritable(InvalidRequest):
    """An output path that cannot be written (a read-only folder, a path under a file, a
    folder where a file should go): found before any model loads."""


class InvalidOption(MizuotoError, ValueError):
    """An option key that does not exist or a value it does not accept."""

    exit_code = 2

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"option {key!r}: {problem}")


class UnsupportedCapability(MizuotoError):
    """The engine or model cannot do what was asked (e.g. streaming on a model without it)."""

    exit_code = 4


class EngineBusy(MizuotoError):
    """A loaded model has no room for another open request (every slot of its per-request
    state is held); ``fix`` says what frees one. A server answers it with 429."""

    exit_code = 1

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} ({fix})" if fix else problem)


class DeadlineExceeded(MizuotoError):
    """A request ran past the deadline it was given (the core's scheduler stops it within one
    step); ``fix`` says what to change. A server answers it with 504."""

    exit_code = 1

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} ({fix})" if fix else problem)


class EngineNotFound(MizuotoError):
    exit_code = 3


class EngineMismatch(MizuotoError):
    """A model given to an engine that does not own it (``-e voxcpm -m <an F5-TTS model>``)."""

    exit_code = 3

    def __init__(self, model: str, engine: str, owners: list[str]) -> None:
        self.model, self.engine, self.owners = model, engine, list(owners)
        owner = " or ".join(self.owners)
        super().__init__(f"{model} is a {owner} model, not a {engine} one; pass -e {owners[0]} "
                         f"(engine={owners[0]!r}) or a {engine} model")


class ModelNotFound(MizuotoError):
    """Neither a local directory nor a catalog id."""

    exit_code = 3


class ModelFilesMissing(MizuotoError):
    """A model directory (or the hub cache) lacks files the engine needs."""

    exit_code = 3

    def __init__(self, location: str, missing: list[str], hint: str = "") -> None:
        self.location = location
        self.missing = list(missing)
        message = f"{location}: missing {', '.join(self.missing)}"
        if hint:
            message += f". {hint}"
        super().__init__(message)


class CheckpointMismatch(MizuotoError):
    """A checkpoint whose keys or shapes do not match the model's configuration."""

    exit_code = 3

    def __init__(
        self,
        path: str,
        *,
        missing: list[str] = (),
        unexpected: list[str] = (),
        shapes: list[str] = (),
        detail: str = "",
    ) -> None:
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.shapes = list(shapes)
        parts = []
        if self.missing:
            parts.append(f"missing keys: {_preview(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys: {_preview(self.unexpected)}")
        if self.shapes:
            parts.append(f"shape mismatches: {_preview(self.shapes)}")
        if detail:
            parts.append(detail)
        super().__init__(f"{path} does not match the model configuration: " + "; ".join(parts))


class UnsafeCheckpoint(CheckpointMismatch):
    """A pickle refused for safety: it holds objects other than tensors, which could run code."""

    def __init__(self, path: str) -> None:
        MizuotoError.__init__(self, (
            f"{path} was refused for safety: this pickle holds objects other than tensors, "
            "and loading them could run code; use a .safetensors file of the weights (convert "
            "it only where you trust its source)"))
        self.missing, self.unexpected, self.shapes = [], [], []


class NonFiniteAudio(MizuotoError):
    """An engine stage produced NaN or infinite values: the result is refused, never returned
    or written. ``stage`` names where they appeared (e.g. ``f5tts vocoder``); bad weights or a
    numerically unstable setting are the usual causes."""

    exit_code = 1

    def __init__(self, stage: str, nan: int, inf: int, total: int) -> None:
        self.stage = stage
        self.nan, self.inf, self.total = nan, inf, total
        super().__init__(f"{stage} produced non-finite values ({nan} NaN, {inf} infinite of "
                         f"{total}): the audio is refused; check the model's weights and the "
                         "request's settings")


class RequestConflict(MizuotoError):
    """A request that would walk into another request's state: e.g. a second call on an
    engine from the thread that holds it for a stream not yet finished. Finish (or close) the
    stream first, or load a second engine."""

    exit_code = 2


class VoiceMismatch(MizuotoError):
    """A saved voice built for another engine or model."""

    exit_code = 2


class DiskFull(MizuotoError, OSError):
    """Writing ``path`` failed because its disk is full (ENOSPC, EDQUOT) or failing (EIO).

    Also an ``OSError`` with that ``errno`` (a server answers the full-disk ones with 507);
    its text is the system's, ``"No space left on device: PATH"``. Nothing partial is left:
    Mizuoto's writers are atomic. :func:`mizuoto.runtime.atomic.storage_error` makes one from
    what the writers raise (``OSError``, libsndfile's "System error.", ``SafetensorError``)."""

    exit_code = 1

    def __init__(self, path: str, code: int = errno.ENOSPC) -> None:
        reason = "Input/output error" if code == errno.EIO else "No space left on device"
        OSError.__init__(self, code, reason, str(path))
        self.path = str(path)

    def __str__(self) -> str:
        return f"{self.strerror}: {self.path}"

    def __reduce__(self):
        return type(self), (self.path, self.errno)  # OSError's fields are set by __init__


def _preview(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    if len(items) > limit:
        shown += f", … ({len(items) - limit} more)"
    return shown
