"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the status
the OpenAI SDK turns into its typed exceptions, mapped from Mizuoto's named errors."""

from __future__ import annotations

import errno
import re

from mizuoto import errors

# an absolute file path (POSIX or Windows), not a URL's: its last part is group 1
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/\\])(?:[A-Za-z]:\\|/)(?=[^\s'\"()<>:;,\\/])"
                            r"(?:[^\s'\"()<>:;,\\/]+[\\/])*"
                            r"([^\s'\"()<>:;,\\/]*)")


def without_paths(message: str) -> str:
    """``message`` with each absolute file path cut to its last part (``/srv/models/x/
    vocab.txt`` -> ``vocab.txt``): a client learns which file, not where the server keeps its
    models; the server's log has the whole message."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1) or "<path>", message)


class APIError(Exception):
    """An error response: HTTP ``status`` and the four fields of OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class ClientGone(Exception):
    """The client disconnected before its response: nothing is sent."""


def quoted(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters: a 900 KB model name
    sent by a client is not echoed back whole (nor written whole to the log)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(str(value)):,} characters)"


def bad_request(message: str, param: str | None = None,
                code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, param: str | None, code: str) -> APIError:
    return APIError(404, message, param=param, code=code)


def unavailable(message: str, code: str, retry_after: int = 5) -> APIError:
    return APIError(503, message, type="server_error", code=code,
                    headers={"Retry-After": str(retry_after)})


def insufficient_storage(message: str) -> APIError:
    """507: the server's disk (the voice folder's) is full; the client's request was fine."""
    return APIError(507, message, type="server_error", code="insufficient_storage",
                    headers={"x-should-retry": "false"})


#: errno values that mean "the disk is full" (ENOSPC, EDQUOT): a 507, not a 500.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def from_mizuoto(exc: BaseException, *, param_prefix: str = "") -> APIError:
    """The response for an error an engine or a request raised.

    Request fields a client sent under the extension key are named as sent
    (``mizuoto.params.speed``); fields the server derived are named as the request field.
    Messages carry no file paths of the server's (:func:`without_paths`)."""
    if isinstance(exc, APIError):
        return exc
    response = _response(exc, param_prefix)
    response.message = without_paths(response.message)
    return response


def _response(exc: BaseException, param_prefix: str) -> APIError:
    if isinstance(exc, errors.UnsupportedSetting):
        return bad_request(str(exc), param=_param(exc.field, param_prefix),
                           code="unsupported_value")
    if isinstance(exc, errors.InvalidRequest):  # InvalidAudio included
        return bad_request(str(exc), param=_param(exc.field, param_prefix))
    if isinstance(exc, errors.VoiceMismatch):
        return bad_request(str(exc), param="voice", code="voice_mismatch")
    if isinstance(exc, errors.UnsupportedCapability):
        return bad_request(str(exc), code="unsupported")
    if isinstance(exc, errors.InvalidOption):
        return bad_request(str(exc), param=exc.key)
    if isinstance(exc, (errors.ModelNotFound, errors.EngineNotFound)):
        return not_found(str(exc), "model", "model_not_found")
    if isinstance(exc, (errors.ModelFilesMissing, errors.CheckpointMismatch)):
        return unavailable(f"the model cannot be loaded: {exc}", "model_unavailable", 60)
    if isinstance(exc, errors.EngineBusy):
        return APIError(429, str(exc), type="rate_limit_error", code="engine_busy",
                        headers={"Retry-After": "1"})
    if isinstance(exc, errors.DeadlineExceeded):
        return APIError(504, str(exc), type="server_error", code="deadline_exceeded")
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        # the hook for full disks (issue 33, 3): a named disk-full error maps here too
        return insufficient_storage("the server's disk is full: no space left to save "
                                    f"this ({exc.strerror})")
    if isinstance(exc, errors.MizuotoError):  # NonFiniteAudio and the rest
        return APIError(500, str(exc), type="server_error", code="generation_failed")
    return APIError(500, "internal error: see the server's log", type="server_error",
                    code="internal_error")


_REQUEST_FIELDS = {"text": "input", "instruction": "instructions"}


def _param(field: str, prefix: str) -> str:
    if field in _REQUEST_FIELDS:
        return _REQUEST_FIELDS[field]
    if field.startswith("params") or field in ("seed", "steps", "guidance"):
        return f"{prefix}{field}"
    return field
