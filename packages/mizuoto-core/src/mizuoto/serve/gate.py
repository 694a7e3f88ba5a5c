"""The server's front door, a pure ASGI wrapper around the application: the API key, the body
limits and the request counter. Pure ASGI, so streaming responses and disconnects pass through
untouched.

- **API key**: ``Authorization: Bearer KEY`` on every path but ``/health`` and those the
  application declares open (the page, which holds no data and asks for the key itself)
  (websockets too), compared in constant time (both sides hashed first, so not even the length
  leaks).
- **Body limits**: counted as the bytes arrive, on every route and whatever the framing
  (``Content-Length`` or chunked): a declared length over the limit is refused before anything
  is read; a body that grows past it is cut off there with 413, whatever the handler was doing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable

from mizuoto.errors import InvalidRequest
from mizuoto.serve.errors import APIError

#: Paths open without the API key (a load balancer's probe has no key).
OPEN_PATHS = frozenset({"/health"})
#: Largest JSON body of a speech request (bytes).
MAX_SPEECH_BODY = 1 << 20
#: Largest body of any route without a limit of its own (none takes one: a stray upload to a
#: GET route, or to a path that does not exist, is cut off here).
MAX_OTHER_BODY = 64 << 10
#: Room for a voice upload's form fields and multipart framing, beyond the clip itself.
FORM_OVERHEAD = 64 << 10


def check_api_key(key: str | None, field: str = "api_key") -> str | None:
    """``key`` if it can be sent in a header and matched: printable ASCII without spaces.
    An empty or blank key is refused: it must never mean "no authentication"."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise InvalidRequest(field, "is empty", "give a key, or leave it unset to serve "
                             "without authentication")
    if not all("!" <= c <= "~" for c in key):
        raise InvalidRequest(field, "must be printable ASCII without spaces (a header carries "
                             "it: Authorization: Bearer KEY)")
    return key


class BodyTooLarge(APIError):
    """The body passed its limit while it was being read."""

    def __init__(self, limit: int, received: int | None = None) -> None:
        told = f"has {received} bytes" if received is not None else "is"
        # the connection closes after the answer: else the server would go on reading (and
        # dropping) the rest of the body, however long, to keep the connection alive
        super().__init__(413, f"the request body {told} more than {limit} bytes",
                         code="request_too_large", headers={"Connection": "close"})


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class Gate:
    """Wraps the ASGI ``app``. ``limits`` maps a path to its body limit (others get
    :data:`MAX_OTHER_BODY`); ``on_request(model, path, status)`` counts each ``/v1/`` request;
    ``is_open(path)`` names paths served without the key besides :data:`OPEN_PATHS`."""

    def __init__(self, app, *, api_key: str | None, limits: dict[str, int], on_request,
                 is_open: Callable[[str], bool] = lambda path: False) -> None:
        self.app = app
        self._is_open = is_open
        self._key = _digest(check_api_key(api_key).encode()) if api_key is not None else None
        self._limits = dict(limits)
        self._on_request = on_request

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = [value for name, value in headers if name.lower() == b"authorization"]
        scheme, _, token = given[0].strip().partition(b" ") if len(given) == 1 else (b"", b"",
                                                                                      b"")
        # the scheme is case-insensitive (RFC 9110); one Authorization header, no more
        matched = hmac.compare_digest(_digest(token.strip()), self._key)
        return matched and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self._key is not None and path not in OPEN_PATHS and not self._is_open(path) \
                and not self._authorized(scope["headers"]):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _send_error(send, APIError(
                401, "missing or wrong API key: send Authorization: Bearer <key>",
                code="invalid_api_key"))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limits.get(path, MAX_OTHER_BODY)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _send_error(send, BodyTooLarge(limit, int(declared)))
            return
        await _Limited(self.app, limit, path, self._on_request)(scope, receive, send)


class _Limited:
    """One request under a body limit: the bytes are counted as the server reads them; past
    the limit the read raises :class:`BodyTooLarge`, and whatever the application answers
    instead (a handler may turn a failed read into a 400) is replaced by the 413."""

    def __init__(self, app, limit: int, path: str, on_request) -> None:
        self.app = app
        self.limit = limit
        self.path = path
        self.on_request = on_request
        self.received = 0
        self.over = False
        self.started = False
        self.status = 500

    async def receive(self, receive):
        message = await receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.over = True
                raise BodyTooLarge(self.limit)
        return message

    async def send(self, send, message) -> None:
        if self.over and not self.started:
            self.started = True
            await _send_error(send, BodyTooLarge(self.limit))
            self.status = 413
            return
        if self.over:
            return  # the 413 has been sent in place of the application's answer
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
        await send(message)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, lambda: self.receive(receive),
                           lambda message: self.send(send, message))
        except Exception:
            # the application has answered (Starlette's last handler sends its 500, logged,
            # then re-raises it); an over-long body is a 413 whatever the handler raised
            if self.over and not self.started:
                await self.send(send, None)
            elif not self.started:
                raise
        finally:
            if self.path.startswith("/v1/"):
                self.on_request(scope.get("mizuoto.model", ""), self.path, self.status)


async def _send_error(send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    for name, value in error.headers.items():
        headers.append((name.lower().encode(), value.encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
